"""On an sm_89+ GPU with TransformerEngine: a few training steps through TE's bf16 layers and its FP8 path
(delayed and current scaling) land where the torch bf16 path does."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from conftest import run_cli

# marks, not skips at import: outside `pytest -m gpu` the module is deselected instead of skipped
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None,
                                 reason="TransformerEngine is not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

STEPS = 60
RUN = ["--config", "gpt2-tiny", "--device", "cuda", f"train-iters={STEPS}", f"save-interval={STEPS}",
       f"eval-interval={STEPS}", "precision=bf16", "compile=false", "--json"]


def train(tmp_path, name: str, *keys: str):
    proc = run_cli("train", "--run-dir", str(tmp_path / name), *RUN, *keys, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    summary, _ = train(tmp_path_factory.mktemp("bf16"), "torch")
    return summary


def test_te_bf16_layers_train_like_torch(tmp_path, reference):
    summary, log = train(tmp_path, "te", "transformer-engine=true")
    assert "TransformerEngine layers: on" in log
    assert summary["final_val_loss"] == pytest.approx(reference["final_val_loss"], abs=0.1)  # TE draws its init in another order


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_te_fp8_trains_like_bf16(tmp_path, reference, recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs an sm_89+ GPU")
    summary, log = train(tmp_path, f"fp8-{recipe}", "transformer-engine=true", "fp8=true", f"fp8-recipe={recipe}")
    assert f"{recipe} scaling): on" in log
    assert summary["final_val_loss"] < summary["first_val_loss"] - 0.5  # it learned
    assert summary["final_val_loss"] == pytest.approx(reference["final_val_loss"], abs=0.15)
