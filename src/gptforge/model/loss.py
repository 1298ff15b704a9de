"""Output layer + cross-entropy in chunks of tokens, never holding the full logits tensor.

The reference (``GPT.forward``) computes logits = h @ W^T for every token: (B*T, V) in the autocast
dtype, a float32 copy for the softmax, and a gradient of the same size in the backward pass (batch 32 x
1024 with V = 50304: 3.3 GB + 6.6 GB + 3.3 GB). Here each chunk's logits live only while that chunk's
loss and its gradients with respect to h and W are computed, all in the forward pass; the backward
only scales the stored gradients by the incoming one. The matmuls are the reference's (same FLOPs), the
logits are rounded to the compute dtype as the reference's are, and the softmax runs in float32, so the
loss and gradients agree with the reference to the compute dtype's rounding. Each chunk's softmax, loss
and logits gradient come from the op ``gptforge::xent`` (a Triton kernel on CUDA; model/xent.py).
"""

from __future__ import annotations

import torch

from gptforge.model.xent import loss_per_row, xent


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
        loss = torch.zeros((), dtype=wide, device=h.device)
        grad_h = torch.empty(h.shape, dtype=dtype, device=h.device)
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device)
        for start in range(0, rows, chunk):
            hc, tc = h[start:start + chunk].to(dtype), targets[start:start + chunk]
            # d(mean loss)/d(logits) = (softmax - one_hot) / rows, rounded to the compute dtype as
            # autograd rounds the reference's gradient before the two backward matmuls.
            loss_rows, grad = xent(hc @ w.t(), tc, vocab_size, 1.0 / rows)
            loss = loss + loss_rows.sum()
            grad_h[start:start + chunk] = grad @ w
            grad_w += (grad.t() @ hc).to(wide)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (h.dtype, weight.dtype)
        return loss / rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (grad_h * grad_loss).to(h_dtype), (grad_w * grad_loss).to(w_dtype), None, None, None, None


def _loss_only(h, weight, targets, vocab_size: int, chunk: int, dtype: torch.dtype) -> torch.Tensor:
    w = weight.to(dtype)
    total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=h.device)
    for start in range(0, h.shape[0], chunk):
        total = total + loss_per_row(h[start:start + chunk].to(dtype) @ w.t(), targets[start:start + chunk], vocab_size).sum()
    return total / h.shape[0]


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                         chunk: int) -> torch.Tensor:
    """Mean cross-entropy of softmax((h @ weight^T)[:, :vocab_size]) against targets.

    h: (N, C) final hidden states, weight: (V_padded, C) output matrix, targets: (N,) token ids,
    chunk: tokens per chunk. Gradients flow to h and weight as through the reference.
    """
    dtype = compute_dtype(h)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, vocab_size, chunk, dtype)
    return _loss_only(h, weight, targets, vocab_size, chunk, dtype)
