"""Output layer + cross-entropy in chunks of tokens, never holding the full logits tensor.

The reference (``GPT.forward``) computes logits = h @ W^T for every token: (B*T, V) in the autocast
dtype, a float32 copy for the softmax, and a gradient of the same size in the backward pass (batch 32 x
1024 with V = 50304: 3.3 GB + 6.6 GB + 3.3 GB). Here each chunk's logits live only while that chunk's
loss and its gradients with respect to h and W are computed, all in the forward pass; the backward
only scales the stored gradients by the incoming one. The matmuls are the reference's (same FLOPs), the
logits are rounded to the compute dtype as the reference's are, and the softmax runs in float32, so the
loss and gradients agree with the reference to the compute dtype's rounding. Each chunk's softmax, loss
and logits gradient come from the op ``gptforge::xent`` (a Triton kernel on CUDA; model/xent.py).

With fp8=True the three matmuls run in FP8 (model/scaled_mm.py): h and W in E4M3, each scaled to its
own amax; the logits gradient written by the kernel straight into E5M2 at a fixed scale (its entries are
softmax / rows, so entry * rows <= 1) for every column but the target's. The target's entry,
(softmax[target] - 1) / rows, is the largest of most rows and the one whose rounding matters most (E5M2
has two mantissa bits, and once the model is confident softmax[target] - 1 is a small difference of
large numbers); it stays out of the FP8 tensor and its products, that entry times W[target] for h and
times h for W's target row, are added in float32 from the exact softmax[target] = exp(-loss). The
logits and the gradient w.r.t. h come out in the compute dtype, the gradient w.r.t. W in float32. With
fp8_logits=False the logits matmul stays in the compute dtype (the loss and softmax are the bf16 path's)
and only the two gradient matmuls run in FP8. That changes the numerics (see BENCHMARKS.md for its loss
parity); it applies where every dimension is a multiple of 16.

With epilogue=True the training path is quack's instead (model/lce_epilogue.py: the softmax in the logits
GEMM's epilogue, over the padded vocabulary); the loss without gradients stays here, over the same columns.
"""

from __future__ import annotations

from functools import partial

import torch

from gptforge.model.lce_epilogue import epilogue_cross_entropy
from gptforge.model.scaled_mm import E5M2, column_major, fits, scaled_mm, to_e4m3
from gptforge.model.xent import loss_per_row, xent

# The E5M2 logits gradient holds softmax * GRAD_SCALE (the target's column 0): within E5M2's range (57344),
# and probabilities down to 2^-31 stay above its smallest step (2^-16).
GRAD_SCALE = 2.0 ** 15


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype autocast would give the output matmul (the tensor's own outside autocast)."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, vocab_size: int, chunk: int, dtype: torch.dtype, fp8: bool, fp8_logits: bool):
        grad_h = torch.empty(h.shape, dtype=dtype, device=h.device)
        chunks = partial(_fp8_chunks, fp8_logits=fp8_logits) if fp8 else _bf16_chunks
        loss, grad_w = chunks(h, weight, targets, vocab_size, chunk, dtype, grad_h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (h.dtype, weight.dtype)
        return loss / h.shape[0]

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (grad_h * grad_loss).to(h_dtype), (grad_w * grad_loss).to(w_dtype), None, None, None, None, None, None


def _accumulate(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """TOTAL + PART, or PART itself for the first chunk: no zero-filled buffer to add into."""
    return part if total is None else total.add_(part)


def _bf16_chunks(h, weight, targets, vocab_size, chunk, dtype, grad_h) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss of every chunk, the gradient w.r.t. weight in float32 or wider); fills grad_h."""
    rows = h.shape[0]
    w = weight.to(dtype)
    wide = torch.promote_types(dtype, torch.float32)
    loss, grad_w = torch.zeros((), dtype=wide, device=h.device), None
    for start in range(0, rows, chunk):
        hc, tc = h[start:start + chunk].to(dtype), targets[start:start + chunk]
        # d(mean loss)/d(logits) = (softmax - one_hot) / rows, rounded to the compute dtype as
        # autograd rounds the reference's gradient before the two backward matmuls.
        loss_rows, grad = xent(hc @ w.t(), tc, vocab_size, 1.0 / rows)
        loss = loss + loss_rows.sum()
        grad_h[start:start + chunk] = grad @ w
        grad_w = _accumulate(grad_w, (grad.t() @ hc).to(wide))
    return loss, grad_w


def _fp8_chunks(h, weight, targets, vocab_size, chunk, dtype, grad_h, fp8_logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """As _bf16_chunks, with the two gradient matmuls in FP8 (the gradient w.r.t. weight in float32), and the
    logits matmul too where FP8_LOGITS."""
    rows = h.shape[0]
    w = None if fp8_logits else weight.to(dtype)
    h8, inv_h = to_e4m3(h)
    w8, inv_w = to_e4m3(weight)
    w8_cols = column_major(w8)  # W as the column-major B of grad_h = grad @ W
    inv_g = inv_h.new_tensor(1.0 / (rows * GRAD_SCALE))
    loss, grad_w = torch.zeros((), dtype=torch.float32, device=h.device), None
    for start in range(0, rows, chunk):
        hc8, tc = h8[start:start + chunk], targets[start:start + chunk]
        logits = scaled_mm(hc8, w8.t(), inv_h, inv_w, dtype) if w is None else h[start:start + chunk].to(dtype) @ w.t()
        loss_rows, p8 = xent(logits, tc, vocab_size, GRAD_SCALE, E5M2, target_column=False)
        loss = loss + loss_rows.sum()
        target_entry = ((torch.exp(-loss_rows) - 1.0) / rows)[:, None]  # (softmax[target] - 1) / rows, float32
        grad_h[start:start + chunk] = scaled_mm(p8, w8_cols, inv_g, inv_w, torch.float32).add_(
            weight[tc].float() * target_entry)
        # softmax^T @ h, contracting over tokens: cuBLAS wants them contiguous in both operands, so
        # softmax^T row-major and h column-major; the product comes out in grad_w's own layout
        grad_w = _accumulate(grad_w, scaled_mm(p8.t().contiguous(), column_major(hc8), inv_g, inv_h, torch.float32))
        grad_w.index_add_(0, tc, h[start:start + chunk].float() * target_entry)
    return loss, grad_w


def _loss_only(h, weight, targets, vocab_size: int, chunk: int, dtype: torch.dtype, fp8: bool) -> torch.Tensor:
    """The mean loss without gradients; FP8: the logits matmul in FP8."""
    if fp8:
        h8, inv_h = to_e4m3(h)
        w8, inv_w = to_e4m3(weight)
        logits_of = lambda start: scaled_mm(h8[start:start + chunk], w8.t(), inv_h, inv_w, dtype)  # noqa: E731
    else:
        w = weight.to(dtype)
        logits_of = lambda start: h[start:start + chunk].to(dtype) @ w.t()  # noqa: E731
    total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=h.device)
    for start in range(0, h.shape[0], chunk):
        total = total + loss_per_row(logits_of(start), targets[start:start + chunk], vocab_size).sum()
    return total / h.shape[0]


def fp8_fits(rows: int, chunk: int, hidden: int, padded_vocab: int) -> bool:
    """Whether every matmul of the FP8 path has dimensions cuBLAS's FP8 matmul takes."""
    return fits(rows, min(chunk, rows), hidden, padded_vocab)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                         chunk: int, fp8: bool = False, fp8_logits: bool = True, epilogue: bool = False) -> torch.Tensor:
    """Mean cross-entropy of softmax((h @ weight^T)[:, :vocab_size]) against targets.

    h: (N, C) final hidden states, weight: (V_padded, C) output matrix, targets: (N,) token ids,
    chunk: tokens per chunk, fp8: the matmuls in FP8 where the shapes allow it (fp8_logits=False: only the two
    gradient matmuls), epilogue: quack's epilogue cross-entropy, whose softmax spans all V_padded columns
    (model/lce_epilogue.py; the caller has checked it can run). Gradients flow to h and weight as through the
    reference.
    """
    dtype = compute_dtype(h)
    training = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if epilogue:  # the loss alone comes from the xent kernel, over the same padded vocabulary
        return epilogue_cross_entropy(h, weight, targets, chunk) if training else \
            _loss_only(h, weight, targets, weight.shape[0], chunk, dtype, False)
    fp8 = fp8 and fp8_fits(h.shape[0], chunk, weight.shape[1], weight.shape[0])
    if training:
        return _LinearCrossEntropy.apply(h, weight, targets, vocab_size, chunk, dtype, fp8, fp8_logits)
    return _loss_only(h, weight, targets, vocab_size, chunk, dtype, fp8 and fp8_logits)
