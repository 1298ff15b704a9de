"""One AdamW step of a weight the model holds in bf16 and the optimizer in float32 (``bf16-weights``).

The optimizer owns the float32 master weight and both moments; the model's bf16 weight is written from the
updated master, rounded to nearest even as autocast's cast of a float32 weight is, so the forward uses it
without a cast and the backward's bf16 gradient reaches the optimizer without one. The arithmetic is torch's
fused AdamW's, in float32: decoupled weight decay, the moments, the bias-corrected step. On CUDA a Triton
kernel reads the gradient, the master and the moments once and writes them and the bf16 weight once;
elsewhere the same arithmetic runs as torch ops.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

BLOCK = 2048  # elements per program; 8 warps stream them (a memory-bound kernel)


@dataclass(frozen=True)
class Hyper:
    """One step's scalars: the group's lr, weight decay, betas and eps, and the step number (from 1)."""

    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    step: int

    @property
    def step_size(self) -> float:
        return self.lr / (1.0 - self.beta1 ** self.step)

    @property
    def bias2_sqrt(self) -> float:
        return math.sqrt(1.0 - self.beta2 ** self.step)


@functools.cache
def _kernel():
    """The Triton kernel, compiled on first use (None when Triton is not importable)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def adamw_bf16(weight_ptr, grad_ptr, master_ptr, avg_ptr, avg_sq_ptr, scale_ptr, n, lr, weight_decay,
                   beta1, beta2, eps, step_size, bias2_sqrt, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        grad = tl.load(grad_ptr + offs, mask=inside).to(tl.float32)
        if HAS_SCALE:
            grad = tl.div_rn(grad, tl.load(scale_ptr))
        master = tl.load(master_ptr + offs, mask=inside)
        avg = tl.load(avg_ptr + offs, mask=inside)
        avg_sq = tl.load(avg_sq_ptr + offs, mask=inside)
        master = master - lr * weight_decay * master
        avg = beta1 * avg + (1.0 - beta1) * grad
        avg_sq = beta2 * avg_sq + (1.0 - beta2) * grad * grad
        denom = tl.div_rn(tl.sqrt_rn(avg_sq), bias2_sqrt) + eps
        master = master - tl.div_rn(step_size * avg, denom)
        tl.store(master_ptr + offs, master, mask=inside)
        tl.store(avg_ptr + offs, avg, mask=inside)
        tl.store(avg_sq_ptr + offs, avg_sq, mask=inside)
        tl.store(weight_ptr + offs, master.to(tl.bfloat16), mask=inside)

    return adamw_bf16


def kernel_available(device: torch.device) -> bool:
    return device.type == "cuda" and _kernel() is not None


def adamw_bf16_step(weight: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, avg: torch.Tensor,
                    avg_sq: torch.Tensor, hyper: Hyper, grad_scale: torch.Tensor | None = None) -> None:
    """Update MASTER, AVG and AVG_SQ (float32) in place from GRAD (bf16 or float32, divided by GRAD_SCALE
    when given) and write the bf16 WEIGHT from the new master. All five are contiguous and of one size."""
    if kernel_available(weight.device):
        _launch(weight, grad, master, avg, avg_sq, hyper, grad_scale)
    else:
        adamw_bf16_torch(weight, grad, master, avg, avg_sq, hyper, grad_scale)


def _launch(weight, grad, master, avg, avg_sq, hyper: Hyper, grad_scale) -> None:
    n = master.numel()
    scale = grad_scale if grad_scale is not None else master  # an unused pointer when HAS_SCALE is off
    _kernel()[(-(-n // BLOCK),)](weight, grad, master, avg, avg_sq, scale, n, hyper.lr, hyper.weight_decay,
                                 hyper.beta1, hyper.beta2, hyper.eps, hyper.step_size, hyper.bias2_sqrt,
                                 HAS_SCALE=grad_scale is not None, BLOCK=BLOCK, num_warps=8)


def adamw_bf16_torch(weight, grad, master, avg, avg_sq, hyper: Hyper, grad_scale=None) -> None:
    """The kernel's arithmetic as torch ops (CPU, or CUDA without Triton)."""
    grad = grad.float()
    if grad_scale is not None:
        grad = grad / grad_scale
    master.sub_(hyper.lr * hyper.weight_decay * master)
    avg.mul_(hyper.beta1).add_((1.0 - hyper.beta1) * grad)
    avg_sq.mul_(hyper.beta2).add_((1.0 - hyper.beta2) * grad * grad)
    denom = avg_sq.sqrt() / hyper.bias2_sqrt + hyper.eps
    master.sub_(hyper.step_size * avg / denom)
    weight.copy_(master)
