"""FlashAttention 4 (the flash-attn-4 package, ``flash_attn.cute``) as torch custom ops: causal, no dropout.

q, k and v come as (batch, seq, heads, head_dim), strided views of the qkv projection are fine, and the
output is (batch, seq, heads, head_dim) contiguous, so the model views it back to (batch, seq, width)
without the transpose copy SDPA's layout needs. torch.compile sees one opaque op per direction (forward:
output and log-sum-exp; backward: dq, dk, dv), so the graph around them still fuses. FA4's kernels are
compiled by the CuTe DSL on first use per shape and cached by it.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

MODULE = "flash_attn.cute.interface"


def _fa4():
    return importlib.import_module(MODULE)


@torch.library.custom_op("gptforge::flash4_fwd", mutates_args=(), device_types="cuda")
def flash4_fwd(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    out, lse = _fa4()._flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)[:2]
    return out, lse


@flash4_fwd.register_fake
def _(q, k, v, scale):
    batch, seq, heads, _ = q.shape
    return q.new_empty(batch, seq, heads, v.shape[-1]), q.new_empty(batch, heads, seq, dtype=torch.float32)


@torch.library.custom_op("gptforge::flash4_bwd", mutates_args=(), device_types="cuda")
def flash4_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               scale: float) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = _fa4()._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=scale, causal=True)[:3]
    return dq, dk, dv


@flash4_bwd.register_fake
def _(dout, q, k, v, out, lse, scale):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _setup_context(ctx, inputs, output):
    q, k, v, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*flash4_bwd(dout.contiguous(), q, k, v, out, lse, ctx.scale), None)


flash4_fwd.register_autograd(_backward, setup_context=_setup_context)


def flash4_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax(q kᵀ / √head_dim) v of (batch, seq, heads, head_dim) tensors."""
    return flash4_fwd(q, k, v, q.shape[-1] ** -0.5)[0]
