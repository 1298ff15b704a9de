"""The residual stream is bf16 under bf16 autocast and float32 everywhere else; weights and their gradients
stay float32, and the loss stays where float32 puts it."""

from __future__ import annotations

import pytest
import torch

from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT

CFG = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=200)


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


def test_under_bf16_autocast_the_stream_is_bf16_and_weights_and_gradients_stay_float32():
    torch.manual_seed(0)
    model = GPT(CFG)
    idx = torch.randint(0, CFG.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert stream_dtypes(model, lambda: model(idx)) == [torch.bfloat16] * 3
    _, grads = loss_and_grads(model, idx, autocast=True)
    assert {g.dtype for g in grads.values()} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("autocast_dtype", [None, torch.float16])
def test_without_bf16_autocast_the_stream_stays_float32(autocast_dtype):
    torch.manual_seed(0)
    model = GPT(CFG)
    idx = torch.randint(0, CFG.vocab_size, (2, 32))
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        assert set(stream_dtypes(model, lambda: model(idx))) == {torch.float32}


def test_the_bf16_stream_keeps_the_loss_and_gradients_of_float32():
    torch.manual_seed(0)
    model = GPT(CFG)
    idx = torch.randint(0, CFG.vocab_size, (4, 32))
    ref_loss, ref_grads = loss_and_grads(model, idx, autocast=False)
    ref_grads = {n: g.clone() for n, g in ref_grads.items()}
    low_loss, low_grads = loss_and_grads(model, idx, autocast=True)
    assert low_loss == pytest.approx(ref_loss, abs=2e-2)
    for name, ref in ref_grads.items():
        assert (low_grads[name] - ref).abs().max() <= 6e-2 * ref.abs().max() + 1e-6, name
