"""Errors that say what to do, in our words: the weights-only refusal by what the file holds, BPE and index
errors, long values cut, undo refusals with a way forward, and a --help that tells what --dry-run runs."""

from __future__ import annotations

import json
import shutil
import os

import pytest
import torch

from conftest import main_one_line, run_cli
from gptforge.errors import GptforgeError, printable
from gptforge.train import checkpoint


class Payload:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_the_weights_only_refusal_is_recognised_by_what_the_file_holds(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": Payload(f"touch {marker}")}, tmp_path / "evil.pt")
    with pytest.raises(GptforgeError) as caught:
        checkpoint.load_file(tmp_path / "evil.pt")
    assert caught.value.message.startswith("refused to read") and "Python objects" in caught.value.message
    assert checkpoint.unsafe_globals(tmp_path / "evil.pt") and not marker.exists()
    (tmp_path / "damaged.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(GptforgeError) as caught:
        checkpoint.load_file(tmp_path / "damaged.pt")
    assert caught.value.message.startswith("cannot read") and caught.value.fix == checkpoint.DAMAGED


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """A small byte-level BPE that prepare trained."""
    root = tmp_path_factory.mktemp("bpe")
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"the quick brown fox {i} jumps"}) + "\n" for i in range(200)))
    main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(root / "o"), "--tokenizer", "bytelevel",
                  "--vocab-size", "300", expect=0)
    return root / "o_tokenizer", corpus


@pytest.mark.parametrize("damage,words", [
    (lambda vocab, merges: (vocab, merges[:3] + ["abc"] + merges[3:]), "line 4 is not two tokens"),
    (lambda vocab, merges: (vocab, merges[:3] + ["zq xw"] + merges[3:]), "line 4 names 'zq', which vocab.json does not hold"),
    (lambda vocab, merges: ({**vocab, "a": "x"}, merges), "token 'a' maps to 'x', not a token id"),
])
def test_bpe_loader_errors_in_our_words(tmp_path, tokenizer_files, damage, words):
    source, corpus = tokenizer_files
    vocab, merges = damage(json.loads((source / "vocab.json").read_text()), (source / "merges.txt").read_text().splitlines())
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "tok" / "merges.txt").write_text("\n".join(merges) + "\n")
    line = main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer",
                         "bytelevel", "--tokenizer-dir", str(tmp_path / "tok"), expect=1)[1]
    assert words in line and "gptforge prepare wrote" in line
    assert not list(tmp_path.glob("o*"))
    assert "Error while" not in line and "invalid at line" not in line  # the library's own text


def test_a_merges_file_larger_than_any_vocabulary_is_refused_unread(tmp_path, tokenizer_files):
    source, corpus = tokenizer_files
    shutil.copytree(source, tmp_path / "tok")
    with open(tmp_path / "tok" / "merges.txt", "r+b") as merges:
        merges.truncate(65 << 20)  # sparse: no disk is used
    line = main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "o"), "--tokenizer",
                         "bytelevel", "--tokenizer-dir", str(tmp_path / "tok"), expect=2)[1]
    assert "merges.txt is larger than 64 MiB" in line and "gptforge prepare wrote" in line
    assert not list(tmp_path.glob("o*"))


def test_index_errors_say_what_to_do(tmp_path, tokenizer_files):
    _, corpus = tokenizer_files
    main_one_line("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "d"), "--tokenizer", "gpt2",
                  expect=0)
    idx = tmp_path / "d_text_document.idx"
    data = bytearray(idx.read_bytes())
    data[9:17] = (7).to_bytes(8, "little")  # an index version no reader knows
    idx.write_bytes(bytes(data))
    for args in (("data", "inspect", str(tmp_path / "d_text_document")),
                 ("data", "merge", "--input", str(tmp_path / "d_text_document"), "--output-prefix", str(tmp_path / "m"))):
        line = main_one_line(*args, expect=1)[1]
        assert "index version 7" in line and "re-run gptforge prepare" in line
    assert not list(tmp_path.glob("m*"))


def test_a_long_value_is_cut_in_the_error_line():
    value = "9" * 3000
    proc = run_cli("compat", "check", "--wheel", f"flash_attn-2.{value}x-cp311-cp311-linux_x86_64.whl")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert value not in proc.stderr and "characters]" in proc.stderr and len(proc.stderr) < 1000
    assert printable("a " + "x" * 201 + " b").startswith("a " + "x" * 120 + "...[41 characters]...")


def test_a_wheel_version_of_a_hundred_thousand_digits():
    line = main_one_line("compat", "check", "--wheel", f"flash_attn-{'1' * 100_000}-cp311-cp311-linux_x86_64.whl",
                         expect=2)[1]
    assert "is not a wheel file name" in line and len(line) < 1000


def test_installed_wheels_of_a_hundred_thousand_digits_or_a_hostile_direct_url(tmp_path):
    """doctor reads the installed extension packages (compat check does not): a version of 100,000 digits, and a
    direct_url.json that is a list or nested 100,000 deep, are passed over, not a traceback."""
    site = tmp_path / "site"
    for name, version, direct_url in (("flash_attn", "1" * 100_000, None), ("deepspeed", "0.16.0", "[1, 2]"),
                                      ("transformer_engine", "2.1.0", "[" * 100_000 + "]" * 100_000)):
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if direct_url:
            (info / "direct_url.json").write_text(direct_url)
    proc = run_cli("doctor", "--json", env={"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-2000:]
    json.loads(proc.stdout)


def test_an_undo_that_would_lead_outside_offers_a_way_forward(env):  # noqa: F811
    main_one_line("fix-links", "--prefix", env, expect=0, stream="stdout")
    path = os.path.join(env, ".gptforge", "links-undo.json")
    with open(path) as f:
        record = json.load(f)
    record["entries"][0]["before"] = {"kind": "link", "target": "/etc/shadow"}
    with open(path, "w") as f:
        json.dump(record, f)
    out = main_one_line("fix-links", "--prefix", env, "--undo", "--json", expect=1, stream="stdout")[1]
    found = [f for f in json.loads(out)["findings"] if f["code"] == "links-outside-prefix"]
    assert found and found[0]["fix"] and "nothing was changed" in found[0]["message"]


def test_fix_links_help_says_what_a_dry_run_runs():
    text = " ".join(main_one_line("fix-links", "--help", expect=0, stream="stdout")[1].split())
    assert "load nothing" not in text and "bin/nvcc --version" in text and "libcudart" in text


def test_installed_metadata_that_is_a_fifo_is_passed_over(tmp_path):
    """A dist-info whose METADATA or direct_url.json is a FIFO (or anything but a regular file) would block
    doctor's read of the installed packages for ever; it is passed over as not installed."""
    site = tmp_path / "site"
    for name, fifo in (("deepspeed", "METADATA"), ("some_package", "METADATA"), ("flash_attn", "direct_url.json")):
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / fifo).unlink(missing_ok=True)
        os.mkfifo(info / fifo)
    proc = run_cli("doctor", "--json", timeout=120,
                   env={"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-2000:]
    json.loads(proc.stdout)
