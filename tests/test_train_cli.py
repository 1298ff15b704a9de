"""`gptforge train` bad input: one line, non-zero exit, no traceback, nothing written; NaN loss reported. The cases
run in this process (run_main); the runs without torch start the installed command, as test_resume.py's do."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from conftest import TINY, one_line_error, run_cli, run_main, tiny_train_args


@pytest.mark.parametrize("args,env,needles", [
    (["hidden-sise=64"], {}, ["unknown config key 'hidden-sise'", "did you mean 'hidden-size'"]),
    (["global-batch-size=24"], {}, ["global-batch-size", "not divisible by micro-batch-size (16) x data-parallel size (1)"]),
    (["global-batch-size=16"], {"WORLD_SIZE": "2"}, ["data-parallel size (2) = 32"]),
    (["seq-length=128"], {}, ["seq-length", "longer than the position table (max-position-embeddings=64)"]),
    (["data-path=missing/corpus_text_document", "tokenizer-type=bytelevel"], {}, ["missing/corpus_text_document.bin", "not found"]),
    (["--config", "gpt2-huge"], {}, ["no config file or packaged config named 'gpt2-huge'"]),
    (["--deepspeed", "nope.json"], {}, ["--deepspeed", "cannot read nope.json: not found"]),
])
def test_bad_input_fails_before_any_work(tmp_path, args, env, needles):
    proc = run_main("train", "--run-dir", str(tmp_path / "run"), *args, env=env, cwd=tmp_path)
    one_line_error(proc, 2, *needles)
    assert not (tmp_path / "run").exists() and not (tmp_path / ".gptforge").exists()


@pytest.mark.parametrize("where,needle", [
    ("a-file/run", "Not a directory"),
    ("/proc/x", "/proc/x cannot be created in /proc"),  # writable by permission bits for root, yet not creatable
])
def test_run_dir_that_cannot_be_made(tmp_path, where, needle):
    (tmp_path / "a-file").write_text("")
    proc = run_main("train", "--run-dir", where, *TINY, cwd=tmp_path)
    one_line_error(proc, 2, "--run-dir", needle)
    assert not (tmp_path / ".gptforge").exists() and list(tmp_path.iterdir()) == [tmp_path / "a-file"]


def test_resume_without_a_run_to_continue(tmp_path):
    proc = run_main("train", "--resume", *TINY, cwd=tmp_path)
    one_line_error(proc, 2, "--resume", "no run under runs/gpt2-tiny* holds a checkpoint")
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".gptforge").exists()


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_asked_for_but_not_installed(tmp_path):
    proc = run_main("train", "--run-dir", str(tmp_path / "run"), *TINY, "--deepspeed", "zero2", cwd=tmp_path)
    one_line_error(proc, 2, "--deepspeed", "DeepSpeed is not installed")
    assert not (tmp_path / "run").exists()


def test_deepspeed_batch_disagreement(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 64, "zero_optimization": {"stage": 2}}))
    proc = run_main("train", "--run-dir", str(tmp_path / "run"), "--deepspeed", str(ds), cwd=tmp_path)
    one_line_error(proc, 2, "train_batch_size=64", "disagrees with the run config (16)")


def test_checkpoint_from_another_shape_is_refused(tmp_path, tiny_run_copy, train_data_cache):
    proc = run_main(*tiny_train_args(tiny_run_copy, train_data_cache, "--resume", "hidden-size=64", "train-iters=8"),
                    cwd=tmp_path)
    one_line_error(proc, 2, "--resume", "another model shape", "hidden_size=32 (config: 64)")
    again = run_main(*tiny_train_args(tiny_run_copy, train_data_cache, "train-iters=8"), cwd=tmp_path)
    one_line_error(again, 2, "already holds checkpoints (newest step_00000004)", "pass --resume")


def test_non_finite_loss_is_reported_with_its_step(tmp_path, train_data_cache):
    proc = run_main("train", "--run-dir", str(tmp_path / "run"), *TINY, "train-iters=20", "lr=1e30", "min-lr=0",
                    "clip-grad=0", f"data-cache-dir={train_data_cache}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert last.startswith("gptforge: error: training loss is") and " at step " in last, last


def test_list_keys_and_configs():
    keys = run_main("train", "--list-keys")  # the default config's values, not the dataclass defaults
    assert keys.returncode == 0 and "global-batch-size = 16 " in keys.stdout and "# samples per optimizer step" in keys.stdout
    big = run_main("train", "--config", "gpt2-124m", "--list-keys", "lr=1e-4")
    assert "global-batch-size = 512 " in big.stdout and "lr = 0.0001 " in big.stdout
    configs = run_main("train", "--list-configs")
    assert configs.stdout.split() == ["gpt2-1.5b", "gpt2-124m", "gpt2-124m-hopper", "gpt2-350m", "gpt2-774m", "gpt2-tiny"]


def test_a_ten_step_smoke_run_just_works(tmp_path, train_data_cache):
    """`gptforge train train-iters=10`: the default warmup (a fraction of the run) fits in it."""
    proc = run_main("train", "train-iters=10", "--run-dir", str(tmp_path / "run"), f"data-cache-dir={train_data_cache}",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 10 steps, validation loss" in proc.stdout and "nan" not in proc.stdout
    assert "estimate on cpu: at least" in proc.stdout and "hopeless" not in proc.stdout


def test_overrides_sit_before_between_and_after_options():
    from gptforge.cli import build_parser, modules_for

    argv = ["train", "lr=1e-3", "--config", "gpt2-tiny", "seq-length=32", "--json", "train-iters=5"]
    args = build_parser(modules_for(argv)).parse_args(argv)
    assert args.overrides == ["lr=1e-3", "seq-length=32", "train-iters=5"]
    assert args.config == "gpt2-tiny" and args.json is True


@pytest.mark.parametrize("command", [["train"], ["sample", "--checkpoint", "runs/x"]])
def test_without_torch_one_line_says_how_to_install_it(tmp_path, command):
    """`pip install -e '.[test]'` brings no torch (the environments bring the right build): no traceback."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass NoTorch:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n")
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    proc = run_cli(*command, env={"PYTHONPATH": pythonpath}, cwd=tmp_path)
    one_line_error(proc, 1, "torch is not installed", "envs/cpu/requirements.txt", "pixi run")
    assert not (tmp_path / "runs").exists()


def test_every_note_code_the_trainer_can_log_is_in_the_docs_table():
    """docs/train.md tells `--json` readers to match on a note's code: each code in train/ and accel/ is in its table."""
    root = Path(__file__).resolve().parent.parent
    codes = {code for package in ("train", "accel") for path in (root / "src" / "gptforge" / package).rglob("*.py")
             for code in re.findall(r'Finding\(\s*"([a-z0-9-]+)"', path.read_text())}
    doc = (root / "docs" / "train.md").read_text()
    assert "deepspeed-step" in codes and len(codes) > 20
    assert sorted(code for code in codes if f"| `{code}` |" not in doc) == []
