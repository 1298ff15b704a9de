"""Cross-entropy's per-row loss and its gradient w.r.t. the logits, in one pass: the op ``gptforge::xent``.

For logits (N, W) (W the padded vocabulary; columns >= vocab_size stand for no token) and targets (N,):
loss[i] = logsumexp(logits[i, :vocab_size]) - logits[i, target[i]], both in float32, and
grad[i] = (softmax(logits[i, :vocab_size]) - one_hot(target[i])) * scale in the logits' dtype, 0 on the
padded columns (or in GRAD_DTYPE: float8_e5m2 for the FP8 output layer, scale chosen to fit; with
target_column=False the target's column is 0, for a caller that adds the target's whole term, softmax - 1,
itself: exp(-loss[i]) is the target's softmax). On CUDA a
Triton kernel makes both while reading each row twice (the second read partly from L2) and writing the
gradient once; the float32 copy of the logits the reference softmax makes never exists. Elsewhere the
same function runs as torch ops. As a registered op it is opaque to torch.compile.
"""

from __future__ import annotations

import functools

import torch

# (columns per step of the row loop, warps per row) by the gradient's bytes per element, the fastest
# measured on an H100 at GPT-2's shape (bench/xent_kernel.py, BENCHMARKS.md)
CONFIGS = {1: (2048, 8), 2: (4096, 8), 4: (4096, 8)}


@functools.cache
def _kernel():
    """The Triton kernel, compiled on first use (None when Triton is not importable)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def xent_rows(logits_ptr, grad_ptr, targets_ptr, loss_ptr, row_stride, width, vocab_size, scale, keep,
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
            p = tl.where(cols == target, (p - 1.0) * keep, p)
            tl.store(grad_row + cols, (p * scale).to(grad_ptr.dtype.element_ty), mask=cols < width)

    return xent_rows


def triton_available() -> bool:
    return _kernel() is not None


def xent_triton(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float,
                grad_dtype: torch.dtype | None = None, target_column: bool = True):
    """(loss per row, gradient) by the Triton kernel; logits rows must be unit-stride."""
    rows, width = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty((rows, width), dtype=grad_dtype or logits.dtype, device=logits.device)
    if rows:
        block, warps = CONFIGS[grad.element_size()]
        _kernel()[(rows,)](logits, grad, targets, loss, logits.stride(0), width, vocab_size, scale,
                           float(target_column), BLOCK=block, num_warps=warps)
    return loss, grad


def _cut_wide(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A float32 (or wider) copy of the logits; the padded columns (no token) get -inf, as if cut."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    if vocab_size < wide.shape[1]:
        wide[:, vocab_size:] = float("-inf")
    return wide


def _lse_and_loss(wide: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(wide, dim=1)
    return lse, lse - wide.gather(1, targets[:, None]).squeeze(1)


def loss_per_row(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The loss of each row alone, as torch ops (float32 or wider): for passes that need no gradient."""
    return _lse_and_loss(_cut_wide(logits, vocab_size), targets)[1]


def xent_torch(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float,
               grad_dtype: torch.dtype | None = None, target_column: bool = True):
    """(loss per row, gradient) as torch ops: the reference the kernel is tested against."""
    wide = _cut_wide(logits, vocab_size)
    lse, loss = _lse_and_loss(wide, targets)
    loss = loss.float()
    grad = torch.exp(wide - lse[:, None])
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] = (grad[rows, targets] - 1.0) * float(target_column)
    return loss, (grad * scale).to(grad_dtype or logits.dtype)


@torch.library.custom_op("gptforge::xent", mutates_args=())
def xent(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float,
         grad_dtype: torch.dtype | None = None, target_column: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss (float32) and scale x its gradient w.r.t. the logits (in GRAD_DTYPE, default the logits';
    0 in the target's column when TARGET_COLUMN is False)."""
    if logits.is_cuda and logits.stride(1) == 1 and triton_available():
        return xent_triton(logits, targets.contiguous(), vocab_size, scale, grad_dtype, target_column)
    return xent_torch(logits, targets, vocab_size, scale, grad_dtype, target_column)


@xent.register_fake
def _(logits, targets, vocab_size, scale, grad_dtype=None, target_column=True):
    return (logits.new_empty(logits.shape[0], dtype=torch.float32),
            torch.empty_like(logits, dtype=grad_dtype or logits.dtype, memory_format=torch.contiguous_format))


def kernel_name(device: torch.device) -> str:
    """Which implementation ``xent`` runs on DEVICE, for the trainer's notes."""
    return "Triton kernel" if device.type == "cuda" and triton_available() else "torch ops"
