"""Output layer + cross-entropy with the softmax in the logits GEMM's epilogue (quack-kernels, sm_90).

``loss-epilogue = true`` hands the fused loss to quack's scaled-exp linear cross-entropy: the logits
GEMM's epilogue stores E = exp(logit - k) in bf16, k a power-of-two offset per row and tile of 192
columns, with each tile's sum of E and the target's float32 logit; a small kernel turns those into the
loss and the target's entry, (softmax[target] - 1), and the two gradient GEMMs rescale E as they load
it. So the logits are never stored and never read back by a softmax kernel of their own: the pass that
``gptforge::xent`` makes over them (two reads and a write of 3.3 GB at batch 32 x 1024) is gone.

Numerics against the xent path: the softmax comes from the GEMM's float32 accumulator rather than from
bf16-rounded logits, the gradient's entries are rounded to bf16 as there, and the target's entry is
formed in float32. One difference in meaning: the softmax spans the padded vocabulary (50304 columns,
as nanoGPT's does), where the xent path cuts it to the tokenizer's. The padding's rows of the tied
embedding stand for no token, so training pushes their logits down; BENCHMARKS.md has the loss parity.
Without gradients (evaluation) the loss comes from the xent path over the same padded vocabulary: quack's
loss-only GEMM does not pass through torch.compile (its custom op's arguments do not survive tracing).
"""

from __future__ import annotations

import torch

ROW_MULTIPLE = 128  # the chunk's rows and the vocabulary are tiled by 128 in the gradient GEMMs
HIDDEN_MULTIPLE = 8  # 16-byte rows for the GEMMs' TMA loads


def epilogue_fits(chunk: int, hidden: int, padded_vocab: int) -> bool:
    """Whether quack's scaled-exp path takes these shapes (its own check also asks for an sm_90 GPU and bf16)."""
    return chunk % ROW_MULTIPLE == 0 and padded_vocab % ROW_MULTIPLE == 0 and hidden % HIDDEN_MULTIPLE == 0


def epilogue_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross-entropy of softmax(h @ weight^T) against targets, through quack; h (N, C), weight (V_padded, C).

    Like the xent path, the gradients w.r.t. h and weight are computed in the forward pass, chunk by chunk,
    and the weight's gradient is accumulated in float32; quack pads a short last chunk to 128 rows itself."""
    from quack.linear_cross_entropy import chunked_linear_cross_entropy

    return chunked_linear_cross_entropy(h, weight, targets, chunk_size=chunk, reduction="mean", use_scaled_exp=True)
