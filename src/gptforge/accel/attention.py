"""Causal attention from cuDNN's forward and FlashAttention 4's backward (flash-attn-4's ``flash_attn.cute``),
as torch custom ops, in a module that takes the place of the model's ``CausalSelfAttention``.

At head dim 64 cuDNN's forward kernel is the faster one and FA4's backward the faster one. cuDNN returns the
output in the query's memory layout and the natural-log log-sum-exp FA4's backward takes, so the two meet
without a copy. The ops take the qkv projection's output (batch, seq, 3·width) whole: q, k and v are strided
views of it, the output comes back as (batch, seq, width) without the transposes SDPA's layout needs, and
the backward writes dq, dk and dv into the slices of one qkv-shaped gradient, so nothing concatenates them.
torch.compile sees one opaque op per direction, so the graph around them still fuses. FA4's kernels are
compiled by the CuTe DSL on first use per shape and cached by it. No dropout.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor, nn

from gptforge.accel.bias_gemm import linear_bias_from_gemm

MODULE = "flash_attn.cute.interface"


def _fa4():
    return importlib.import_module(MODULE)


def _heads(qkv: Tensor, heads: int) -> list[Tensor]:
    """q, k, v as strided (batch, seq, heads, head_dim) views of QKV (batch, seq, 3·width)."""
    batch, seq, width3 = qkv.shape
    return [t.view(batch, seq, heads, width3 // (3 * heads)) for t in qkv.split(width3 // 3, dim=2)]


def _cudnn():
    return torch.ops.aten._scaled_dot_product_cudnn_attention


@torch.library.custom_op("gptforge::cudnn_fwd", mutates_args=())
def cudnn_fwd(qkv: Tensor, heads: int, scale: float) -> tuple[Tensor, Tensor]:
    batch, seq, _ = qkv.shape
    q, k, v = (t.transpose(1, 2) for t in _heads(qkv, heads))
    out, lse = _cudnn()(q, k, v, None, True, 0.0, True, False, scale=scale)[:2]
    # out is (batch, heads, seq, head_dim) laid out as q is, so both of these are views, not copies
    return out.transpose(1, 2).contiguous(), lse.reshape(batch, heads, seq).contiguous()


@cudnn_fwd.register_fake
def _(qkv, heads, scale):
    batch, seq, width3 = qkv.shape
    return (qkv.new_empty(batch, seq, heads, width3 // (3 * heads)),
            qkv.new_empty(batch, heads, seq, dtype=torch.float32))


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


cudnn_fwd.register_autograd(_backward, setup_context=_setup_context)


def cudnn_flash4_attention(qkv: Tensor, heads: int) -> Tensor:
    """Causal softmax(q kᵀ / √head_dim) v for QKV (batch, seq, 3·width) holding q, k, v side by side;
    the output is (batch, seq, width)."""
    batch, seq, width3 = qkv.shape
    out, _ = cudnn_fwd(qkv, heads, (width3 // (3 * heads)) ** -0.5)
    return out.view(batch, seq, width3 // 3)


def autocast_dtype(t: Tensor) -> Tensor:
    """T in the dtype autocast gives a Linear's operands (a custom autograd function takes them cast)."""
    return t.to(torch.get_autocast_dtype("cuda")) if torch.is_autocast_enabled("cuda") else t


class FlashAttention(nn.Module):
    """The model's attention (its qkv and proj layers, their weights and names) with cuDNN's forward, FA4's
    backward, and the qkv projection's bias gradient from its weight-gradient GEMM (accel/bias_gemm.py)."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.heads = attention.heads
        self.qkv, self.proj, self.resid_dropout = attention.qkv, attention.proj, attention.resid_dropout

    def forward(self, x: Tensor) -> Tensor:
        qkv = linear_bias_from_gemm(*(autocast_dtype(t) for t in (x, self.qkv.weight, self.qkv.bias)))
        return self.resid_dropout(self.proj(cudnn_flash4_attention(qkv, self.heads)))
