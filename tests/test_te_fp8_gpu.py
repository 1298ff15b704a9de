"""On an sm_89+ GPU with TransformerEngine: accel=te-fp8 (TE's layers in the blocks, FP8 with delayed scaling)
trains a few steps to where the torch bf16 path does, on the same weights."""

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
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                                 reason="FP8 needs an sm_89+ NVIDIA GPU")]

STEPS = 60
RUN = ["--config", "gpt2-tiny", "--device", "cuda", f"train-iters={STEPS}", f"save-interval={STEPS}",
       f"eval-interval={STEPS}", "precision=bf16", "compile=false", "--json"]


def train(tmp_path, choice: str) -> dict:
    proc = run_cli("train", "--run-dir", str(tmp_path / choice), *RUN, f"accel={choice}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_te_fp8_trains_like_bf16(tmp_path):
    reference, fp8 = train(tmp_path, "triton"), train(tmp_path, "te-fp8")
    assert "accel-te-fp8" in {note["code"] for note in fp8["notes"]}  # how many layers: the test below
    assert fp8["final_val_loss"] < fp8["first_val_loss"] - 0.5  # it learned
    assert fp8["final_val_loss"] == pytest.approx(reference["final_val_loss"], abs=0.15)


def test_the_swapped_blocks_keep_the_weights_and_their_names():
    from gptforge.accel.te import use_te_fp8
    from gptforge.model.config import ModelConfig
    from gptforge.model.gpt import GPT

    cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=100)
    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_te_fp8(model) == 8
    after = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    assert after.keys() == before.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, msg=name)
