"""AdamW parameter groups (weight decay on linear-layer matrices only) and gradient clipping with the step."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.train.optim import clipped_step, folds_clipping, param_groups


def test_decay_skips_biases_layernorms_and_embeddings():
    model = GPT(ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=2, max_position_embeddings=16,
                            vocab_size=100))
    decay, no_decay = param_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    expected = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert decayed == {f"{n}.weight" for n in expected}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "blocks.0.attn.qkv.bias"} <= skipped
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def _stepped(fold: bool, max_norm: float, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Parameters after two fused-AdamW steps on gradients of norm ~10, clipped one way or the other."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    assert folds_clipping(opt)
    params = list(model.parameters())
    for _ in range(2):
        loss = (model(torch.randn(64, 16)) * 50).square().mean()
        loss.backward()
        if fold:
            norm = clipped_step(opt, params, max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()
        opt.zero_grad()
    assert not hasattr(opt, "grad_scale")  # nothing left behind for the next step
    return [p.detach().clone() for p in params], norm


@settings(max_examples=10, deadline=None)
@given(max_norm=st.sampled_from([0.5, 1.0, 1e6, math.inf]), seed=st.integers(0, 2**16))
def test_clipping_folded_into_fused_adamw_steps_as_clip_grad_norm_does(max_norm, seed):
    folded, norm = _stepped(True, max_norm, seed)
    separate, norm_separate = _stepped(False, max_norm, seed)
    torch.testing.assert_close(norm, norm_separate, rtol=1e-6, atol=0)
    for a, b in zip(folded, separate):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_optimizers_without_the_fused_kernel_clip_the_gradients_themselves():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    assert not folds_clipping(opt)
    model(torch.randn(8, 4)).square().sum().mul(100).backward()
    before = [p.grad.clone() for p in model.parameters()]
    norm = clipped_step(opt, list(model.parameters()), 1.0)
    after = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert norm > 1.0 and abs(after.item() - 1.0) < 1e-4 and before[0].norm() > after
