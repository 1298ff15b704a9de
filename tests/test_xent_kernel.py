"""gptforge::xent: the loss per row and the logits gradient, as torch ops (model/loss.py) and as the Triton
kernel (accel/xent_kernel.py).

The torch implementation is held to autograd through F.cross_entropy on the cut logits; the Triton
kernel to the torch implementation, on the CPU through Triton's interpreter (TRITON_INTERPRET=1, in a
child process: the variable must be set before Triton is imported) and on a GPU for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.model.loss import xent, xent_torch

ROOT = Path(__file__).resolve().parents[1]


def autograd_reference(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int):
    """Per-row loss and d(mean loss)/d(logits) of the reference: cut the padded columns, float32 softmax."""
    leaf = logits.detach().to(torch.promote_types(logits.dtype, torch.float32)).requires_grad_()
    rows = F.cross_entropy(leaf[:, :vocab_size], targets, reduction="none")
    rows.mean().backward()
    return rows.detach(), leaf.grad


@settings(max_examples=examples(40), deadline=None)
@given(rows=st.integers(1, 9), vocab=st.integers(2, 70), pad=st.integers(0, 9), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.1, 3.0, 30.0]))
def test_torch_xent_is_the_autograd_cross_entropy(rows, vocab, pad, seed, spread):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab + pad, generator=g, dtype=torch.float64) * spread
    targets = torch.randint(0, vocab, (rows,), generator=g)
    loss, grad = xent_torch(logits, targets, vocab, 1.0 / rows)
    ref_loss, ref_grad = autograd_reference(logits.double(), targets, vocab)
    torch.testing.assert_close(loss, ref_loss.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad.double(), rtol=1e-6, atol=1e-9)
    assert torch.equal(grad[:, vocab:], torch.zeros(rows, pad, dtype=grad.dtype))  # padded columns: no token


def test_the_op_leaves_its_input_alone_and_keeps_the_dtype():
    logits = torch.randn(4, 20)
    before = logits.clone()
    loss, grad = xent(logits, torch.tensor([0, 3, 17, 5]), 18, 0.25)
    assert torch.equal(logits, before)
    assert (loss.dtype, grad.dtype, grad.shape) == (torch.float32, torch.float32, (4, 20))
    _, grad16 = xent(logits.bfloat16(), torch.tensor([0, 3, 17, 5]), 18, 0.25)
    assert grad16.dtype == torch.bfloat16


INTERPRETED = r"""
import json, sys, torch
from gptforge.accel import xent_kernel as X
from gptforge.model.loss import xent_torch
cases = []
for rows, width, vocab, block, dtype, stride_pad in [
        (5, 200, 190, 64, torch.float32, 0),   # 4 blocks, the last one partly padded
        (3, 256, 256, 64, torch.float32, 0),   # no padding, blocks end on the width
        (4, 130, 100, 32, torch.bfloat16, 0),  # bf16 logits and gradient
        (3, 96, 90, 128, torch.float32, 7),    # one block wider than the row; rows further apart than the width
        (1, 10, 3, 16, torch.float32, 0)]:
    g = torch.Generator().manual_seed(rows * width)
    buf = (torch.randn(rows, width + stride_pad, generator=g) * 4).to(dtype)
    logits = buf[:, :width]
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[0] = vocab - 1  # the last real column
    X.CONFIGS[dtype.itemsize] = (block, 4)  # the gradient has the logits' dtype here
    loss, grad = X.xent_triton(logits, targets, vocab, 1.0 / rows)
    ref_loss, ref_grad = xent_torch(logits, targets, vocab, 1.0 / rows)
    cases.append({"dtype": str(dtype), "loss": (loss - ref_loss).abs().max().item(),
                  "grad": (grad.float() - ref_grad.float()).abs().max().item(),
                  "grad_scale": ref_grad.float().abs().max().item(), "pad": grad[:, vocab:].abs().max().item() if vocab < width else 0.0,
                  "contiguous": grad.is_contiguous()})
print("CASES " + json.dumps(cases))
"""


def triton_path() -> str | None:
    """Where Triton can be imported from, or None (CI installs it in .ci/triton; a CUDA torch brings it)."""
    extra = os.environ.get("GPTFORGE_TRITON_DIR", str(ROOT / ".ci" / "triton"))
    probe = subprocess.run([sys.executable, "-c", "import triton"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([extra, os.environ.get("PYTHONPATH", "")])})
    return extra if probe.returncode == 0 else None


def interpreted_cases(script: str) -> list[dict]:
    """Run SCRIPT in a child process under Triton's interpreter and return the cases it prints after "CASES "
    (skips where Triton is not importable)."""
    extra = triton_path()
    if extra is None:
        pytest.skip("Triton is not importable here (.ci/run installs it in .ci/triton)")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), extra, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.split("CASES ", 1)[1])


def test_the_triton_kernel_computes_what_the_torch_ops_do_in_the_interpreter():
    cases = interpreted_cases(INTERPRETED)
    assert len(cases) == 5
    for case in cases:
        bf16 = case["dtype"] == "torch.bfloat16"
        assert case["loss"] < 1e-5
        assert case["grad"] <= (2 ** -8 * case["grad_scale"] if bf16 else 1e-6), case  # one bf16 rounding at most
        assert case["pad"] == 0.0 and case["contiguous"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_gpu_the_kernel_matches_the_reference_at_gpt2_width(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from gptforge.accel.xent_kernel import triton_available, xent_triton

    assert triton_available()
    torch.manual_seed(0)
    logits = (torch.randn(1024, 50304, device="cuda") * 3).to(dtype)
    targets = torch.randint(0, 50257, (1024,), device="cuda")
    loss, grad = xent_triton(logits, targets, 50257, 1.0 / 1024)
    ref_loss, ref_grad = autograd_reference(logits, targets, 50257)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    tol = 2 ** -8 * ref_grad.abs().max().item() if dtype == torch.bfloat16 else 1e-7
    assert (grad.float() - ref_grad).abs().max().item() <= tol
    assert grad[:, 50257:].abs().max().item() == 0


@pytest.mark.gpu
def test_on_gpu_accel_makes_the_kernel_the_ops_cuda_implementation():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from gptforge.accel.xent_kernel import use_kernel

    assert use_kernel()
    logits = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, 4000, (64,), device="cuda")
    torch.testing.assert_close(xent(logits, targets, 4000, 0.5), xent_torch(logits, targets, 4000, 0.5),
                               rtol=2e-2, atol=1e-2)
