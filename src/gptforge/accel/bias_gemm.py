"""A linear layer whose bias gradient comes out of its weight-gradient GEMM (the qkv projection under
``accel = "hopper"``).

A bias gradient is the column sum of the output's gradient, which nn.Linear's backward computes in a
pass of its own over that whole gradient for a few thousand numbers. Here the input gets columns of ones
beside it in the forward (under torch.compile the LayerNorm before it writes them, in the same kernel), so
the weight-gradient GEMM's sum over tokens takes them along: doutᵀ · [x | 1] is [dW | db]. The forward GEMM
reads x as a strided view of the wider buffer; the weight gradient computes ONES more columns.
"""

from __future__ import annotations

import torch
from torch import Tensor

ONES = 8  # columns of ones the weight-gradient GEMM reads: a multiple of 16 bytes in bf16
# The wider buffer's rows are ROW_ALIGN elements apart times n (128 bytes times n in bf16): a GEMM reading a
# strided view of rows an odd number of 16 bytes apart runs slower (BENCHMARKS.md, section "Levers")
ROW_ALIGN = 64


class BiasFromWeightGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        wide = with_ones(x.reshape(-1, x.shape[-1]))
        out = torch.addmm(bias, wide[:, : x.shape[-1]], weight.t())
        ctx.save_for_backward(wide, weight)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dout: Tensor):
        wide, weight = ctx.saved_tensors
        rows = dout.reshape(-1, dout.shape[-1])
        width = weight.shape[1]
        weight_and_bias = rows.t() @ wide  # (out, in + ONES): column `in` sums dout over the tokens
        dx = (rows @ weight).view(*dout.shape[:-1], width)
        return dx, weight_and_bias[:, :width], weight_and_bias[:, width]


def with_ones(rows: Tensor) -> Tensor:
    """ROWS with ONES columns of ones beside them: a GEMM's sum over the rows of [rows | 1] takes a bias gradient
    along. The buffer's rows are ROW_ALIGN elements wide times n (the columns past ONES are ones too, never read)."""
    width = rows.shape[1]
    pitch = -(-(width + ONES) // ROW_ALIGN) * ROW_ALIGN
    return torch.cat([rows, rows.new_ones(rows.shape[0], pitch - width)], dim=1)[:, : width + ONES]


def linear_bias_from_gemm(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x · weightᵀ + bias (nn.Linear's layout), the bias gradient summed by the weight-gradient GEMM.
    Operands in the dtype the matmuls run in (the caller casts under autocast)."""
    return BiasFromWeightGradient.apply(x, weight, bias)
