"""Hostile values: deep files, wrong values inside checkpoints, sizes far out of range, odd paths and a full
disk. Each is one line and a non-zero exit, without a traceback, a hang, or a write outside the place named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile

import pytest
import torch

from conftest import SMALL, main_one_line, run_cli, tiny_train_args
from gptforge.train import checkpoint

DEEP_JSON = '{"a":' * 100_000 + "1" + "}" * 100_000
DEEP_TOML = "a = " + "[" * 100_000 + "]" * 100_000


@pytest.fixture
def run(tiny_run_copy):
    return tiny_run_copy


def resume(run, cache, *extra, expect=1):
    return main_one_line(*tiny_train_args(run, cache, "--resume", "train-iters=8", *extra), expect=expect)[1]


def sample(run, *extra, expect=1):
    return main_one_line("sample", "--checkpoint", str(run), "--max-new-tokens", "2", "--device", "cpu", *extra,
                         expect=expect)[1]


# deep nesting everywhere a structured file is read

def test_deep_config_files(tmp_path):
    for name, text in (("deep.json", DEEP_JSON), ("deep.toml", DEEP_TOML)):
        (tmp_path / name).write_text(text)
        line = main_one_line("train", "--config", str(tmp_path / name), "--run-dir", str(tmp_path / "r"), expect=2)[1]
        assert "--config" in line and "nested more than" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text,words", [(DEEP_JSON, "nested more than"), ("[1, 2]", "holds a list")])
def test_deepspeed_config_deep_or_a_list(tmp_path, train_data_cache, text, words):
    (tmp_path / "ds.json").write_text(text)
    line = main_one_line(*tiny_train_args(tmp_path / "r", train_data_cache, "--deepspeed", str(tmp_path / "ds.json")),
                         expect=2)[1]
    assert "--deepspeed" in line and words in line


def test_deep_checksums(run, train_data_cache):
    (checkpoint.latest(run / "checkpoints") / checkpoint.CHECKSUMS_FILE).write_text("[" * 100_000 + "]" * 100_000)
    line = resume(run, train_data_cache)
    assert "checksums.json" in line and "nested more than" in line and "older one" in line


def test_deep_vocab_and_dataset_metadata(tmp_path, tiny_trained_run, train_data_cache):
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "vocab.json").write_text(DEEP_JSON)
    (tokenizer / "merges.txt").write_text("#version: 0.2\n")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello"}\n')
    line = main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer",
                         "bytelevel", "--tokenizer-dir", str(tokenizer), expect=1)[1]
    assert "vocab.json" in line and "nested more than" in line
    source = next(train_data_cache.glob("default-*"))
    for name in ("stdlib_docs_text_document.bin", "stdlib_docs_text_document.idx"):
        shutil.copy(source / name, tmp_path / name)
    (tmp_path / "stdlib_docs_text_document.meta.json").write_text(DEEP_JSON)
    line = main_one_line("data", "merge", "--input", str(tmp_path / "stdlib_docs_text_document"), "--output-prefix",
                         str(tmp_path / "merged"), expect=1)[1]
    assert "meta.json" in line and "nested more than" in line and "gptforge prepare" in line
    assert not list(tmp_path.glob("merged*"))


def test_a_deep_override_value(tmp_path):
    line = main_one_line("train", "--config", "gpt2-tiny", "--run-dir", str(tmp_path / "r"), "hidden-size=" + "[" * 100_000,
                         expect=2)[1]
    assert "hidden-size must be int" in line and len(line) < 600


# wrong values inside checkpoint files

def tamper(run, name, change):
    ckpt = checkpoint.latest(run / "checkpoints")
    torch.save(change(torch.load(ckpt / name, weights_only=True)), ckpt / name)
    checkpoint.write_checksums(ckpt)


def model_config(**values):
    return lambda state: {**state, "model_config": {**state["model_config"], **values}}


@pytest.mark.parametrize("name,change,words", [
    ("trainer.pt", model_config(num_attention_heads=0), "num_attention_heads is 0"),
    ("trainer.pt", model_config(hidden_size=-32), "hidden_size is -32"),
    ("trainer.pt", model_config(dropout=float("nan")), "dropout is nan"),
    ("trainer.pt", model_config(num_layers=10 ** 15), "weights alone need"),
])
def test_a_crafted_model_shape_is_refused_by_resume_and_sample(run, train_data_cache, name, change, words):
    tamper(run, name, change)
    for line in (resume(run, train_data_cache), sample(run)):
        assert "trainer.pt: model_config" in line and words in line and "older one" in line


@pytest.mark.parametrize("name,change", [
    ("optimizer.pt", lambda state: {}),
    ("trainer.pt", lambda state: {**state, "scheduler": {"garbage": [1, 2]}}),
    ("rng_rank0.pt", lambda state: {"python": (1, 2), "numpy": 3, "torch_cpu": torch.zeros(3)}),
    ("model.pt", lambda state: {key: torch.zeros(3) for key in state}),
])
def test_saved_state_that_does_not_fit(run, train_data_cache, name, change):
    tamper(run, name, change)
    line = resume(run, train_data_cache)
    assert "the saved state does not fit this run" in line and "--run-dir" in line


def test_a_resume_with_another_model_shape_is_told(run, train_data_cache):
    tamper(run, "trainer.pt", lambda state: {**state, "model_shape": {**state["model_shape"], "hidden_size": 64}})
    line = resume(run, train_data_cache, expect=2)
    assert "holds another model shape: hidden_size=64 (config: 32)" in line


@pytest.mark.parametrize("name", ["model.pt", "trainer.pt"])
def test_a_compressed_record_is_refused_before_loading(run, train_data_cache, name):
    """A record deflated into the zip could unpack past memory; torch.save never compresses one."""
    ckpt = checkpoint.latest(run / "checkpoints")
    with zipfile.ZipFile(ckpt / name) as original:
        records = [(info, original.read(info)) for info in original.infolist()]
    with zipfile.ZipFile(ckpt / name, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for info, data in records:
            packed.writestr(info.filename, data)
    checkpoint.write_checksums(ckpt)
    for line in (resume(run, train_data_cache), sample(run)):
        assert line.startswith(f"gptforge: error: refused to read {ckpt / name}: its record ") and "is compressed" in line


# sizes far out of range: refused before a model is built, naming the key

@pytest.mark.parametrize("overrides,key", [
    (["num-layers=12345678901234567890"], "num-layers"),
    (["hidden-size=1000000000000", "num-attention-heads=2"], "hidden-size"),
    (["max-position-embeddings=100000000000000"], "max-position-embeddings"),
    (["micro-batch-size=100000000", "global-batch-size=100000000"], "micro-batch-size"),
])
def test_sizes_far_out_of_range(tmp_path, train_data_cache, overrides, key):
    start = time.monotonic()
    line = main_one_line(*tiny_train_args(tmp_path / "r", train_data_cache, *overrides), expect=2)[1]
    assert line.startswith(f"gptforge: usage error: {key}: ") and "needs at least" in line
    assert time.monotonic() - start < 30


def test_a_config_file_of_a_hundred_thousand_layers(tmp_path):
    (tmp_path / "deep.toml").write_text("num-layers = 100000\nhidden-size = 768\nnum-attention-heads = 12\n")
    line = main_one_line("train", "--config", str(tmp_path / "deep.toml"), "--run-dir", str(tmp_path / "r"), expect=2)[1]
    assert line.startswith("gptforge: usage error: num-layers: 100000 needs at least")


# paths and disks

def prepared_data(cache) -> list[str]:
    """The keys that train on the embedded corpus as a prepared data set (its own files, not the cache's)."""
    source = next(cache.glob("default-*"))
    return ["data-path=" + str(source / "stdlib_docs_text_document"), "tokenizer-type=bytelevel",
            f"vocab-file={source / 'tokenizer' / 'vocab.json'}", f"merge-file={source / 'tokenizer' / 'merges.txt'}"]


@pytest.mark.parametrize("where", ["/proc/self/x", "/proc/self/status", "/proc"])
def test_a_data_cache_dir_that_cannot_be_written(tmp_path, tiny_trained_run, train_data_cache, where):
    data = prepared_data(train_data_cache)
    args = ["train", "--config", "gpt2-tiny", "--run-dir", str(tmp_path / "r"), *SMALL, *data, f"data-cache-dir={where}"]
    assert "data-cache-dir: cannot write in" in main_one_line(*args, expect=2)[1]


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk, leave: int) -> None:
    (disk / "filler").write_bytes(b"\0" * max(shutil.disk_usage(disk).free - leave, 0))


@pytest.mark.parametrize("leave", [4096, 20000])
def test_full_disk_in_prepare(tmp_path, small_disk, leave):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} of a corpus that fills a small disk"}) + "\n"
                              for i in range(3000)))
    fill(small_disk, leave)
    line = main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(small_disk / "out"),
                         "--tokenizer", "gpt2", expect=1)[1]
    assert "No space left on device" in line and "free space there" in line
    assert sorted(os.listdir(small_disk)) == ["filler"]


@pytest.mark.parametrize("default_corpus", [False, True])
def test_full_disk_in_the_training_data_cache(tmp_path, tiny_trained_run, train_data_cache, small_disk, default_corpus):
    data = [] if default_corpus else prepared_data(train_data_cache)
    fill(small_disk, 20000)
    line = main_one_line(*tiny_train_args(tmp_path / "r", small_disk / "cache", *data), expect=1, last_line=True)[1]
    assert "No space left on device" in line and str(small_disk) in line


# sample's own values

def test_a_prompt_that_is_not_utf8(tiny_trained_run):
    proc = run_cli("sample", "--checkpoint", str(tiny_trained_run), "--prompt", os.fsdecode(b"a\xffb"), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gptforge: usage error: --prompt: character 1")


def test_a_temperature_below_float32(tiny_trained_run):
    assert "--temperature: 1e-300 is below float32's resolution" in sample(tiny_trained_run, "--temperature", "1e-300", expect=2)


# a word of three megabytes

def test_a_document_without_spaces_is_tokenized_in_bounded_time(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello world " * 50}) + "\n" + json.dumps({"text": "abcdefghij" * 300_000}) + "\n")
    start = time.monotonic()
    proc = run_cli("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer", "bytelevel",
                   "--vocab-size", "300", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - start < 60


def test_every_packaged_config_passes_the_size_check_on_one_h100():
    """The bound is a lower bound: no config the project ships is refused on the GPU it is tuned for."""
    from gptforge.model.loss import CHUNK_TOKENS
    from gptforge.train.config import load_config, packaged_configs
    from gptforge.train.sizes import SIZE_KEYS, training_bytes

    for name in packaged_configs():
        cfg, _ = load_config(name)
        sizes = {key: getattr(cfg, key.replace("-", "_")) for key in SIZE_KEYS}
        need = training_bytes(sizes, vocab_size=50304, logit_tokens=CHUNK_TOKENS, world_size=1)
        assert need < 78 << 30, name
    offloaded = training_bytes({**sizes, "num-layers": 10_000}, vocab_size=50304, logit_tokens=0, world_size=0)
    assert offloaded < training_bytes({**sizes, "num-layers": 10_000}, vocab_size=50304, logit_tokens=0, world_size=1)
