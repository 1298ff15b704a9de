"""FlashAttention 4 (the flash-attn-4 package, ``flash_attn.cute``) as torch custom ops: causal, no dropout.

The ops take the qkv projection's output (batch, seq, 3·width) whole: q, k and v are strided views of
it, the output comes back as (batch, seq, width) without the transposes SDPA's layout needs, and the
backward writes dq, dk and dv into the slices of one qkv-shaped gradient, so nothing concatenates them.
torch.compile sees one opaque op per direction (forward: output and log-sum-exp; backward: the qkv
gradient), so the graph around them still fuses. FA4's kernels are compiled by the CuTe DSL on first
use per shape and cached by it.

The forward can instead come from cuDNN (``gptforge::cudnn_fwd``, attention-backend=cudnn-flash4): at
head dim 64 its forward kernel is the faster one and FA4's backward the faster one. cuDNN returns the
output in the query's memory layout and the natural-log log-sum-exp FA4's backward takes, so the two
meet without a copy.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

MODULE = "flash_attn.cute.interface"


def _fa4():
    return importlib.import_module(MODULE)


def _heads(qkv: Tensor, heads: int) -> list[Tensor]:
    """q, k, v as strided (batch, seq, heads, head_dim) views of QKV (batch, seq, 3·width)."""
    batch, seq, width3 = qkv.shape
    return [t.view(batch, seq, heads, width3 // (3 * heads)) for t in qkv.split(width3 // 3, dim=2)]


@torch.library.custom_op("gptforge::flash4_fwd", mutates_args=())
def flash4_fwd(qkv: Tensor, heads: int, scale: float) -> tuple[Tensor, Tensor]:
    out, lse = _fa4()._flash_attn_fwd(*_heads(qkv, heads), softmax_scale=scale, causal=True, return_lse=True)[:2]
    return out, lse


def _cudnn():
    return torch.ops.aten._scaled_dot_product_cudnn_attention


@torch.library.custom_op("gptforge::cudnn_fwd", mutates_args=())
def cudnn_fwd(qkv: Tensor, heads: int, scale: float) -> tuple[Tensor, Tensor]:
    batch, seq, _ = qkv.shape
    q, k, v = (t.transpose(1, 2) for t in _heads(qkv, heads))
    out, lse = _cudnn()(q, k, v, None, True, 0.0, True, False, scale=scale)[:2]
    # out is (batch, heads, seq, head_dim) laid out as q is, so both of these are views, not copies
    return out.transpose(1, 2).contiguous(), lse.reshape(batch, heads, seq).contiguous()


def _fwd_shapes(qkv, heads, scale):
    batch, seq, width3 = qkv.shape
    return (qkv.new_empty(batch, seq, heads, width3 // (3 * heads)),
            qkv.new_empty(batch, heads, seq, dtype=torch.float32))


flash4_fwd.register_fake(_fwd_shapes)
cudnn_fwd.register_fake(_fwd_shapes)


@torch.library.custom_op("gptforge::flash4_bwd", mutates_args=())
def flash4_bwd(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, heads: int, scale: float) -> Tensor:
    dqkv = torch.empty_like(qkv)
    dq, dk, dv = _heads(dqkv, heads)  # FA4 writes each gradient into its slice: no concatenation after
    _fa4()._flash_attn_bwd(*_heads(qkv, heads), out, dout, lse, softmax_scale=scale, causal=True, dq=dq, dk=dk, dv=dv)
    return dqkv


@flash4_bwd.register_fake
def _(dout, qkv, out, lse, heads, scale):
    return torch.empty_like(qkv)


def _setup_context(ctx, inputs, output):
    qkv, heads, scale = inputs
    out, lse = output
    ctx.save_for_backward(qkv, out, lse)
    ctx.heads, ctx.scale = heads, scale


def _backward(ctx, dout, _dlse):
    qkv, out, lse = ctx.saved_tensors
    return flash4_bwd(dout.contiguous(), qkv, out, lse, ctx.heads, ctx.scale), None, None


flash4_fwd.register_autograd(_backward, setup_context=_setup_context)
cudnn_fwd.register_autograd(_backward, setup_context=_setup_context)
FORWARDS = {"flash4": flash4_fwd, "cudnn-flash4": cudnn_fwd}  # attention-backend -> the forward op before FA4's backward


def flash4_attention(qkv: Tensor, heads: int, backend: str = "flash4") -> Tensor:
    """Causal softmax(q kᵀ / √head_dim) v for QKV (batch, seq, 3·width) holding q, k, v side by side;
    the output is (batch, seq, width). BACKEND (a key of FORWARDS) picks the forward kernel; the backward is FA4's."""
    batch, seq, width3 = qkv.shape
    out, _ = FORWARDS[backend](qkv, heads, (width3 // (3 * heads)) ** -0.5)
    return out.view(batch, seq, width3 // 3)
