"""The qkv projection's bias gradient from its weight-gradient GEMM (accel=hopper) gives nn.Linear's output and
gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt_pairs import assert_trains_as_the_default
from gptforge.accel.bias_gemm import ONES, ROW_ALIGN, linear_bias_from_gemm


def operands(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(48, 16, dtype=dtype, requires_grad=True)
    bias = torch.randn(48, dtype=dtype, requires_grad=True)
    return x, weight, bias


@pytest.mark.parametrize("compiled", [False, True])
def test_output_and_every_gradient_are_nn_linears(compiled):
    dtype = torch.float32 if compiled else torch.float64
    mine, theirs = operands(dtype), operands(dtype)
    grad_out = torch.randn(3, 5, 48, dtype=dtype)
    linear = torch.compile(linear_bias_from_gemm, fullgraph=True) if compiled else linear_bias_from_gemm
    out = linear(*mine)
    out.backward(grad_out)
    ref = F.linear(*theirs)
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    for got, want in zip(mine, theirs):
        torch.testing.assert_close(got.grad, want.grad)
    torch.testing.assert_close(mine[2].grad, grad_out.sum((0, 1)))  # the bias gradient is the column sum


def test_the_gemm_sees_the_ones_beside_the_input():
    """The saved wider input really carries the ones: the weight gradient's extra columns are the bias gradient.
    Its rows lie ROW_ALIGN elements apart times n (128 bytes in bf16), so the forward GEMM's loads of x stay aligned."""
    x, weight, bias = operands(torch.float64)
    out = linear_bias_from_gemm(x, weight, bias)
    wide, _ = out.grad_fn.saved_tensors
    assert wide.shape == (15, 16 + ONES) and bool((wide[:, 16:] == 1).all())
    assert wide.stride() == (ROW_ALIGN, 1)
    torch.testing.assert_close(wide[:, :16], x.detach().reshape(15, 16))


def test_gpt_with_the_bias_from_the_gemm_trains_as_the_default():
    def swap(model):
        for block in model.blocks:
            qkv = block.attn.qkv
            qkv.forward = lambda x, layer=qkv: linear_bias_from_gemm(x, layer.weight, layer.bias)

    assert_trains_as_the_default(swap, rtol=1e-5, atol=1e-6)
