"""qkv-bias-gemm: the qkv projection's bias gradient from its weight-gradient GEMM gives nn.Linear's
output and gradients; on only where torch's own linear layer runs, with a note otherwise. mlp-bias-gemm: the
MLP up-projection's the same way, on only with quack's MLP and where hopper-kernels measured it faster."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptforge.model.bias_gemm import ONES, ROW_ALIGN, linear_bias_from_gemm
from gptforge.model.layers import LayerBackend
from gptforge.train.config import load_config, validate
from gptforge.train.loop import mlp_bias_gemm, qkv_bias_gemm
from gpt_pairs import assert_trains_as_the_default


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
    assert_trains_as_the_default(LayerBackend(qkv_bias_gemm=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keys, layers, on, says", [
    (["qkv-bias-gemm=true"], {"linear": "torch"}, {"qkv"}, "qkv projection: bias gradient from the weight-gradient GEMM"),
    (["qkv-bias-gemm=true"], {"linear": "te"}, set(), "but TransformerEngine layers are on"),
    (["qkv-bias-gemm=true", "float8=rowwise"], {"linear": "torch"}, set(), "but float8=rowwise is on"),
    (["mlp-bias-gemm=true"], {"mlp": "quack"}, {"mlp"}, "MLP up-projection: bias gradient from the weight-gradient GEMM"),
    (["mlp-bias-gemm=true"], {"mlp": "torch"}, set(), "but gelu-epilogue is not on"),
    ([], {"linear": "torch", "mlp": "quack"}, set(), None),
])
def test_each_bias_from_the_gemm_only_where_its_layer_takes_it(keys, layers, on, says):
    """qkv-bias-gemm with torch's own linear layer, mlp-bias-gemm with quack's MLP; a note says which."""
    cfg, _ = load_config("gpt2-tiny", keys)
    validate(cfg)
    backend = LayerBackend(**layers)
    notes = [note for note in (qkv_bias_gemm(cfg, backend), mlp_bias_gemm(cfg, backend)) if note]
    assert {name for name in ("qkv", "mlp") if getattr(backend, f"{name}_bias_gemm")} == on
    assert notes == [] if says is None else (len(notes) == 1 and says in notes[0])


@pytest.mark.parametrize("config, value", [("gpt2-124m", True), ("gpt2-350m", False), ("gpt2-774m", False),
                                           ("gpt2-1.5b", False)])
def test_hopper_kernels_take_the_mlps_bias_from_the_gemm_only_where_it_measured_faster(config, value, monkeypatch):
    """BENCHMARKS.md runs 94 and 100: +0.42% at 124M, +0.2% (noise) at 350M; the wider configs keep the epilogue's sum."""
    from gptforge.model import kernels
    from gptforge.train.hopper_keys import apply_hopper_keys

    monkeypatch.setattr(kernels, "hopper_keys_blocker", lambda device: None)
    resolved, note = apply_hopper_keys(load_config(config, [])[0], torch.device("cuda", 0))
    assert resolved.mlp_bias_gemm is value and "mlp-bias-gemm" in note
