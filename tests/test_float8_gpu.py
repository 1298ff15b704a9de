"""On an sm_89+ GPU with torchao: a few training steps with the blocks' Linear layers in torchao float8
(tensorwise and rowwise scaling) land where the bf16 path does; on the CPU the key falls back and says so."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

torch = pytest.importorskip("torch")

STEPS = 60
RUN = ["--config", "gpt2-tiny", f"train-iters={STEPS}", f"save-interval={STEPS}", f"eval-interval={STEPS}", "--json"]


def train(tmp_path, name: str, *keys: str):
    proc = run_cli("train", "--run-dir", str(tmp_path / name), *RUN, *keys, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def test_cpu_run_falls_back_to_plain_matmuls_and_says_why(tmp_path, train_data_cache):
    _, log = train(tmp_path, "cpu", "--device", "cpu", "train-iters=2", "save-interval=2", "eval-interval=2",
                   "float8=tensorwise", f"data-cache-dir={train_data_cache}")
    assert "torchao float8 asked for but needs an sm_89+ GPU" in log


gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                         reason="needs an sm_89+ NVIDIA GPU")
GPU_RUN = ("--device", "cuda", "precision=bf16", "compile=true")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    summary, _ = train(tmp_path_factory.mktemp("bf16"), "torch", *GPU_RUN)
    return summary


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8_trains_like_bf16(tmp_path, reference, recipe):
    pytest.importorskip("torchao.float8", reason="torchao is not installed")
    summary, log = train(tmp_path, recipe, *GPU_RUN, f"float8={recipe}")
    assert f"float8 (torchao, {recipe} scaling): on" in log
    assert summary["final_val_loss"] < summary["first_val_loss"] - 0.5  # it learned
    assert summary["final_val_loss"] == pytest.approx(reference["final_val_loss"], abs=0.15)
