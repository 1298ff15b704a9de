"""A plain GPT and one with modules swapped in after it was built, on the same weights: both trained one step on
the same tokens, their losses and every parameter's gradient compared. And the loss the plain way computes it,
from the whole logits, for tests to swap in as the reference."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT

TINY = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16, vocab_size=100)


class ReferenceLoss(nn.Module):
    """F.cross_entropy over the whole float32 logits of the tokenizer's VOCAB_SIZE columns (nanoGPT's way)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(F.linear(h, weight)[:, : self.vocab_size].float(), targets)


def assert_trains_as_the_default(swap: Callable[[GPT], None], rtol: float, atol: float, cfg: ModelConfig = TINY,
                                 device: str = "cpu") -> None:
    torch.manual_seed(0)
    reference = GPT(cfg).to(device)
    model = GPT(cfg).to(device)
    model.load_state_dict(reference.state_dict())
    swap(model)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.max_position_embeddings), device=device)
    losses = [m(x, x)[1] for m in (reference, model)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=rtol, atol=atol)
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=rtol, atol=atol, msg=name)
