"""Output layer + cross-entropy in chunks of tokens, never holding the full logits tensor.

The plain way computes logits = h @ W^T for every token: (B*T, V) in the autocast dtype, a float32 copy
for the softmax, and a gradient of the same size in the backward pass (gigabytes each at GPT-2's batch and
vocabulary). Here each chunk's logits live only while that chunk's loss and its gradients
with respect to h and W are computed, all in the forward pass; the backward only scales the stored
gradients by the incoming one. The matmuls are the plain way's (same FLOPs), the logits are rounded to the
compute dtype as autocast rounds them, and the softmax runs in float32, so the loss and gradients agree with
``F.cross_entropy`` on the logits to the compute dtype's rounding.

Each chunk's per-row loss and logits gradient come from the op ``gptforge::xent``, torch ops here; the
speed package gives it a Triton kernel on CUDA (gptforge/accel/xent_kernel.py). As an op it is opaque to
torch.compile, so the kernel that replaces it sees the same call.
"""

from __future__ import annotations

import torch
from torch import nn

CHUNK_TOKENS = 32768  # tokens per chunk: one chunk for a GPT-2 micro batch of 32 x 1024


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
    """The loss of each row alone (float32 or wider): for passes that need no gradient."""
    return _lse_and_loss(_cut_wide(logits, vocab_size), targets)[1]


def xent_torch(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float):
    """Per-row loss (float32) and scale x its gradient w.r.t. the logits (in the logits' dtype, 0 on the padded
    columns >= vocab_size): the softmax minus the target's one-hot."""
    wide = _cut_wide(logits, vocab_size)
    lse, loss = _lse_and_loss(wide, targets)
    grad = torch.exp(wide - lse[:, None])
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] -= 1.0
    return loss.float(), (grad * scale).to(logits.dtype)


@torch.library.custom_op("gptforge::xent", mutates_args=())
def xent(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``xent_torch`` as an op: what a kernel registered for a device (accel/xent_kernel.py) replaces."""
    return xent_torch(logits, targets, vocab_size, scale)


@xent.register_fake
def _(logits, targets, vocab_size, scale):
    return (logits.new_empty(logits.shape[0], dtype=torch.float32),
            torch.empty_like(logits, memory_format=torch.contiguous_format))


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype autocast would give the output matmul (the tensor's own outside autocast)."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, vocab_size: int, chunk: int, dtype: torch.dtype):
        rows = h.shape[0]
        w = weight.to(dtype)
        wide = torch.promote_types(dtype, torch.float32)
        grad_h = torch.empty(h.shape, dtype=dtype, device=h.device)
        loss, grad_w = torch.zeros((), dtype=wide, device=h.device), None
        for start in range(0, rows, chunk):
            hc, tc = h[start:start + chunk].to(dtype), targets[start:start + chunk]
            # d(mean loss)/d(logits) = (softmax - one_hot) / rows, rounded to the compute dtype as
            # autograd rounds the plain way's gradient before the two backward matmuls.
            loss_rows, grad = xent(hc @ w.t(), tc, vocab_size, 1.0 / rows)
            loss = loss + loss_rows.sum()
            grad_h[start:start + chunk] = grad @ w
            part = (grad.t() @ hc).to(wide)
            grad_w = part if grad_w is None else grad_w.add_(part)  # no zero-filled buffer for the first chunk
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (h.dtype, weight.dtype)
        return loss / rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (grad_h * grad_loss).to(h_dtype), (grad_w * grad_loss).to(w_dtype), None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                         chunk: int = CHUNK_TOKENS) -> torch.Tensor:
    """Mean cross-entropy of softmax((h @ weight^T)[:, :vocab_size]) against targets.

    h: (N, C) final hidden states, weight: (V_padded, C) output matrix, targets: (N,) token ids, chunk:
    tokens per chunk. Gradients flow to h and weight as through F.cross_entropy on the logits."""
    dtype = compute_dtype(h)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, vocab_size, chunk, dtype)
    w = weight.to(dtype)
    total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=h.device)
    for start in range(0, h.shape[0], chunk):
        logits = h[start:start + chunk].to(dtype) @ w.t()
        total = total + loss_per_row(logits, targets[start:start + chunk], vocab_size).sum()
    return total / h.shape[0]


class FusedLoss(nn.Module):
    """The model's loss: ``linear_cross_entropy`` over the tokenizer's VOCAB_SIZE columns."""

    def __init__(self, vocab_size: int, chunk: int = CHUNK_TOKENS):
        super().__init__()
        self.vocab_size, self.chunk = vocab_size, chunk

    def forward(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(h, weight, targets, self.vocab_size, self.chunk)
