"""The Triton kernel behind the op ``gptforge::xent`` on CUDA (the model's fused loss, model/loss.py).

For logits (N, W) (W the padded vocabulary; columns >= vocab_size stand for no token) and targets (N,) it
writes each row's loss, logsumexp(logits[i, :vocab_size]) - logits[i, target[i]], in float32, and the
gradient (softmax - one_hot) * scale in the logits' dtype, 0 on the padded columns, reading each row twice
(the second read partly from L2) and writing the gradient once: the float32 copy of the logits a softmax
of torch ops makes never exists. ``use_kernel`` registers it as the op's CUDA implementation.
"""

from __future__ import annotations

import functools

import torch

from gptforge.model.loss import xent, xent_torch

# (columns per step of the row loop, warps per row) by the gradient's bytes per element: the fastest measured
# on an H100 at GPT-2's shape (bench/xent_kernel.py)
CONFIGS = {2: (4096, 8), 4: (4096, 8)}


@functools.cache
def _kernel():
    """The Triton kernel, compiled on first use (None when Triton is not importable)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def xent_rows(logits_ptr, grad_ptr, targets_ptr, loss_ptr, row_stride, width, vocab_size, scale,
                  BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        logits_row = logits_ptr + row * row_stride
        grad_row = grad_ptr + row * width
        target = tl.load(targets_ptr + row)
        # pass 1: running max and sum of exponentials over the vocabulary (online softmax)
        m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
        s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        for start in range(0, vocab_size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(logits_row + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        lse = m + tl.log(s)
        tl.store(loss_ptr + row, lse - tl.load(logits_row + target).to(tl.float32))
        # pass 2: the gradient of every column, padded ones included (exp(-inf) = 0), last block first:
        # what pass 1 read last is what L2 most likely still holds
        blocks = tl.cdiv(width, BLOCK)
        for i in range(0, blocks):
            start = (blocks - 1 - i) * BLOCK
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(logits_row + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32)
            p = tl.exp(x - lse)
            p = tl.where(cols == target, p - 1.0, p)
            tl.store(grad_row + cols, (p * scale).to(grad_ptr.dtype.element_ty), mask=cols < width)

    return xent_rows


def triton_available() -> bool:
    return _kernel() is not None


def xent_triton(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float):
    """(loss per row, gradient) by the Triton kernel; logits rows must be unit-stride."""
    rows, width = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty((rows, width), dtype=logits.dtype, device=logits.device)
    if rows:
        block, warps = CONFIGS[grad.element_size()]
        _kernel()[(rows,)](logits, grad, targets.contiguous(), loss, logits.stride(0), width, vocab_size, scale,
                           BLOCK=block, num_warps=warps)
    return loss, grad


def _on_cuda(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float):
    if logits.stride(1) == 1 and logits.element_size() in CONFIGS:
        return xent_triton(logits, targets, vocab_size, scale)
    return xent_torch(logits, targets, vocab_size, scale)


def use_kernel() -> bool:
    """Make the kernel the op's CUDA implementation (from now on, in this process); False where Triton is missing."""
    if not triton_available():
        return False
    xent.register_kernel("cuda")(_on_cuda)
    return True
