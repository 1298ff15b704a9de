"""Output layer + cross-entropy with the softmax in the logits GEMM's epilogue (quack-kernels, sm_90, bf16),
in place of the model's ``FusedLoss``.

quack's scaled-exp linear cross-entropy: the logits GEMM's epilogue stores E = exp(logit - k) in bf16, k a
power-of-two offset per row and tile of 192 columns, with each tile's sum of E and the target's float32
logit; a small kernel turns those into the loss and the target's entry, (softmax[target] - 1), and the two
gradient GEMMs rescale E as they load it. So the logits are never stored and never read back by a softmax
kernel of their own: the pass the ``gptforge::xent`` kernel makes over them is gone.

Numerics against that path: the softmax comes from the GEMM's float32 accumulator rather than from
bf16-rounded logits, the gradient's entries are rounded to bf16 as there, and the target's entry is formed
in float32. One difference in meaning: the softmax spans the padded vocabulary (as nanoGPT's does), where
the model's own loss cuts it to the tokenizer's. The padding's rows of the tied embedding stand for no
token, so training pushes their logits down. Without gradients (evaluation) the loss comes from the model's
own path over the same padded vocabulary: quack's loss-only GEMM does not pass through torch.compile.
"""

from __future__ import annotations

import torch
from torch import nn

from gptforge.model.loss import linear_cross_entropy

ROW_MULTIPLE = 128  # the chunk's rows and the vocabulary are tiled by 128 in the gradient GEMMs
HIDDEN_MULTIPLE = 8  # 16-byte rows for the GEMMs' TMA loads


def epilogue_fits(chunk: int, hidden: int, padded_vocab: int) -> bool:
    """Whether quack's scaled-exp path takes these shapes (its own check also asks for an sm_90 GPU and bf16)."""
    return chunk % ROW_MULTIPLE == 0 and padded_vocab % ROW_MULTIPLE == 0 and hidden % HIDDEN_MULTIPLE == 0


class EpilogueLoss(nn.Module):
    """Mean cross-entropy of softmax(h @ weight^T) over the padded vocabulary; h (N, C), weight (V_padded, C).

    Like the model's own loss, the gradients w.r.t. h and weight are computed in the forward pass, chunk by
    chunk, and the weight's gradient is accumulated in float32; quack pads a short last chunk to 128 rows."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk = chunk

    def forward(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)):
            return linear_cross_entropy(h, weight, targets, weight.shape[0], self.chunk)
        from quack.linear_cross_entropy import chunked_linear_cross_entropy

        return chunked_linear_cross_entropy(h, weight, targets, chunk_size=self.chunk, reduction="mean",
                                            use_scaled_exp=True)
