"""bf16-residual: the residual stream in bf16 under bf16 autocast, float32 everywhere else; weights and their
gradients stay float32, and the loss stays where the float32 stream puts it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gptforge.model import GPT, ModelConfig
from gptforge.model.layers import LayerBackend
from gptforge.train.config import TrainConfig
from gptforge.train.loop import bf16_residual
from gptforge.train.precision import choose

CFG = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=200)
CPU = torch.device("cpu")


def twins(device: str = "cpu") -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    reference = GPT(CFG).to(device)
    low = GPT(CFG, LayerBackend(bf16_residual=True)).to(device)
    low.load_state_dict(reference.state_dict())
    return reference, low


def stream_dtypes(model: GPT, run) -> list[torch.dtype]:
    """The dtype of the residual stream entering each block and the final LayerNorm."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype)) for m in (*model.blocks, model.ln_f)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def loss_and_grads(model: GPT, idx: torch.Tensor, autocast: bool) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=autocast):
        _, loss = model(idx, idx)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def test_under_bf16_autocast_the_stream_is_bf16_and_weights_stay_float32():
    reference, low = twins()
    idx = torch.randint(0, CFG.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert stream_dtypes(low, lambda: low(idx)) == [torch.bfloat16] * 3
        assert stream_dtypes(reference, lambda: reference(idx)) == [torch.float32] * 3
    _, grads = loss_and_grads(low, idx, autocast=True)
    assert {g.dtype for g in grads.values()} == {torch.float32}


def test_the_bf16_stream_keeps_the_loss_and_gradients_of_the_float32_one():
    reference, low = twins()
    idx = torch.randint(0, CFG.vocab_size, (4, 32))
    ref_loss, ref_grads = loss_and_grads(reference, idx, autocast=True)
    low_loss, low_grads = loss_and_grads(low, idx, autocast=True)
    assert low_loss == pytest.approx(ref_loss, abs=2e-2)
    for name, ref in ref_grads.items():
        assert (low_grads[name] - ref).abs().max() <= 5e-2 * ref.abs().max() + 1e-6, name


@pytest.mark.parametrize("autocast_dtype", [None, torch.float16])
def test_without_bf16_autocast_it_changes_nothing(autocast_dtype):
    reference, low = twins()
    idx = torch.randint(0, CFG.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        assert set(stream_dtypes(low, lambda: low(idx))) == {torch.float32}
    if autocast_dtype is None:
        assert loss_and_grads(low, idx, autocast=False)[0] == loss_and_grads(reference, idx, autocast=False)[0]


@pytest.mark.parametrize("precision, on, note", [
    ("bf16", True, "residual stream: bf16 (weights, LayerNorm statistics and weight gradients float32)"),
    ("auto", False, "residual stream: float32 (bf16-residual applies to bf16 runs; this run is fp32)"),
    ("fp32", False, "residual stream: float32 (bf16-residual applies to bf16 runs; this run is fp32)"),
])
def test_the_trainer_turns_it_on_only_for_bf16_runs(precision, on, note):
    backend = LayerBackend()
    assert bf16_residual(TrainConfig(bf16_residual=True), backend, choose(precision, CPU)) == note
    assert backend.bf16_residual is on
    assert bf16_residual(TrainConfig(), LayerBackend(), choose("bf16", CPU)) is None


def test_the_trainer_logs_the_choice(tmp_path, train_data_cache):
    cmd = [sys.executable, "-m", "gptforge", "train", "--config", "gpt2-tiny", "--device", "cpu", "--json",
           "--run-dir", str(tmp_path / "run"), "train-iters=2", "lr-warmup-iters=1", "bf16-residual=true",
           f"data-cache-dir={train_data_cache}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "residual stream: float32 (bf16-residual applies to bf16 runs; this run is fp32)" in json.loads(proc.stdout)["notes"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(), reason="needs a bf16 GPU")
def test_on_gpu_training_with_a_bf16_stream_lands_where_the_float32_one_does(tmp_path):
    run = ["--config", "gpt2-tiny", "--device", "cuda", "--json", "precision=bf16", "compile=true", "train-iters=60",
           "save-interval=60", "eval-interval=60", f"data-cache-dir={tmp_path / 'data'}"]
    results = {}
    for name, keys in (("float32", []), ("bf16", ["bf16-residual=true"])):
        proc = subprocess.run([sys.executable, "-m", "gptforge", "train", *run, "--run-dir", str(tmp_path / name), *keys],
                              capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[name] = json.loads(proc.stdout)
    assert any(n.startswith("residual stream: bf16") for n in results["bf16"]["notes"])
    assert results["bf16"]["final_val_loss"] < results["bf16"]["first_val_loss"] - 0.5
    assert results["bf16"]["final_val_loss"] == pytest.approx(results["float32"]["final_val_loss"], abs=0.1)
