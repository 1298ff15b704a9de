"""`gptforge sample` bad input: one line, non-zero exit, no traceback (a real checkpoint: the session's four-step
run). The cases run in this process (run_main); the first starts the installed command."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import one_line_error, run_main
from gptforge.errors import GptforgeError
from gptforge.train import checkpoint


STEP = "step_00000004"


@pytest.fixture
def run_dir(tiny_trained_run):
    return tiny_trained_run


def test_empty_prompt_starts_a_document(run_dir, cli):
    proc = cli("sample", "--checkpoint", str(run_dir), "--prompt", "", "--max-new-tokens", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["step"] == 4 and out["tokens"] == 5


def test_the_default_length_fits_the_models_context(run_dir):
    """`gptforge sample --checkpoint RUN --prompt 'The'`, the line `train` prints at its end, works on a model whose
    context is shorter than the default length: the default fills the context instead."""
    proc = run_main("sample", "--checkpoint", str(run_dir), "--prompt", "", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == 32 - 1  # max-position-embeddings=32, the empty prompt is one token


@pytest.mark.parametrize("args,code,needles", [
    (["--top-k", "-5"], 2, ["--top-k: must be >= 0"]),
    (["--temperature", "-1"], 2, ["--temperature: must be a finite number >= 0"]),
    (["--max-new-tokens", "0"], 2, ["--max-new-tokens: must be positive"]),
    # the context (max-position-embeddings=32) bounds the work, instead of 100,000 forward passes
    (["--max-new-tokens", "100000"], 2, ["--max-new-tokens: 100000 new tokens after a prompt of 1",
                                         "context of 32 tokens", "use --max-new-tokens 31"]),
    (["--temperature", "nan"], 2, ["--temperature: must be a finite number >= 0, got nan"]),
    (["--temperature", "inf"], 2, ["--temperature: must be a finite number >= 0, got inf"]),
    (["--seed", "1e24"], 2, ["--seed: invalid int value: '1e24'"]),
    (["--seed", "1" + "0" * 24], 2, ["--seed: 1" + "0" * 24 + " is outside [0, 2**32)"]),
    (["--seed", "-1"], 2, ["--seed: -1 is outside [0, 2**32)"]),
])
def test_bad_sampling_options(run_dir, args, code, needles):
    one_line_error(run_main("sample", "--checkpoint", str(run_dir), "--prompt", "x", *args), code, *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_asked_for_without_a_gpu(run_dir):
    one_line_error(run_main("sample", "--checkpoint", str(run_dir), "--prompt", "x", "--device", "cuda"), 2,
                   "--device", "torch sees no GPU")


@pytest.mark.parametrize("damaged", ["model.pt", "trainer.pt"])
@pytest.mark.parametrize("resigned", [False, True], ids=["checksum", "unreadable"])
def test_damaged_checkpoint_file(run_dir, tmp_path, damaged, resigned):
    from gptforge.train import checkpoint

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    ckpt = copy / "checkpoints" / STEP
    (ckpt / damaged).write_bytes(b"not a torch file")
    if resigned:  # checksums that match the damage: the loader itself must still fail in one line
        checkpoint.write_checksums(ckpt)
    words = [f"cannot read {copy}"] if resigned else [str(ckpt / damaged), "checksum mismatch"]
    one_line_error(run_main("sample", "--checkpoint", str(copy), "--prompt", "x"), 1, *words, damaged, "damaged")


def test_missing_tokenizer(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "tokenizer")
    one_line_error(run_main("sample", "--checkpoint", str(copy), "--prompt", "x"), 1,
                   "the run's tokenizer does not load")


def test_a_foreign_step_directory_is_ignored(run_dir, tmp_path):
    """checkpoints/step_abc (not a step number) used to stop every command with a ValueError."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.copytree(copy / "checkpoints" / STEP, copy / "checkpoints" / "step_abc")
    proc = run_main("sample", "--checkpoint", str(copy), "--prompt", "x", "--max-new-tokens", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checkpoint"].endswith(STEP)


def _drop(state, key):
    del state[key]


def _nested(state, outer, key, value):
    state[outer][key] = value


@pytest.mark.parametrize("change,needles", [
    (lambda s: _drop(s, "step"), ["no 'step' entry"]),
    (lambda s: _drop(s, "model_config"), ["no 'model_config' entry"]),
    (lambda s: s.update(step="12"), ["'step' holds str '12'"]),
    (lambda s: s.update(step=True), ["'step' holds bool True"]),
    (lambda s: s.update(step=-3), ["negative step"]),
    (lambda s: s.update(tokenizer=["bytelevel"]), ["'tokenizer' holds list"]),
    (lambda s: _nested(s, "model_config", "num_layers", "2"), ["model_config['num_layers'] holds str '2'"]),
    (lambda s: _nested(s, "model_config", "rotary", True), ["model_config has unknown entries ['rotary']"]),
    (lambda s: _drop(s["model_config"], "hidden_size"), ["model_config has no 'hidden_size'"]),
    (lambda s: _nested(s, "tokenizer", "kind", 3), ["tokenizer['kind'] holds int 3"]),
    (lambda s: s.clear() or s.update(a=1), ["no 'step' entry"]),
])
def test_trainer_state_with_missing_or_mistyped_keys(run_dir, tmp_path, change, needles):
    ckpt = tmp_path / STEP
    shutil.copytree(run_dir / "checkpoints" / STEP, ckpt)
    state = torch.load(ckpt / "trainer.pt", weights_only=False)  # the test's own file, written by the fixture's run
    change(state)
    torch.save(state, ckpt / "trainer.pt")
    checkpoint.write_checksums(ckpt)  # re-signed: the content check, not the checksum, must catch it
    with pytest.raises(GptforgeError) as err:
        checkpoint.read_trainer_state(ckpt)
    for needle in (f"{ckpt / 'trainer.pt'}: ", "damaged", *needles):
        assert needle in err.value.one_line()


def test_trainer_state_that_is_not_a_dict(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "checkpoints" / STEP / "trainer.pt"
    torch.save([1, 2], path)
    checkpoint.write_checksums(path.parent)
    one_line_error(run_main("sample", "--checkpoint", str(copy), "--prompt", "x"), 1, "holds a list, not a dict")
