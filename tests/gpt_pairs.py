"""A default GPT and one built with another layer backend, on the same weights: both trained one step on the
same tokens, their losses and every parameter's gradient compared."""

from __future__ import annotations

import torch

from gptforge.model import GPT, ModelConfig
from gptforge.model.layers import LayerBackend

TINY = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16, vocab_size=100)


def assert_trains_as_the_default(backend: LayerBackend, rtol: float, atol: float) -> None:
    torch.manual_seed(0)
    reference = GPT(TINY)
    model = GPT(TINY, backend)
    model.load_state_dict(reference.state_dict())
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    losses = [m(x, x)[1] for m in (reference, model)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0])
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=rtol, atol=atol, msg=name)
