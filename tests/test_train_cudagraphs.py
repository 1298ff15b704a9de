"""Gradient accumulation under CUDA graphs (accel=hopper compiles the step into them): the engine keeps
.grad buffers of its own, so each micro batch's gradient is added into memory no graph replay overwrites."""

from __future__ import annotations

import pytest
import torch

from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.train.config import load_config
from gptforge.train.engine import TorchEngine
from gptforge.train.precision import choose

TINY = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16, vocab_size=100)


def _engine(cuda_graphs: bool, accum: int) -> TorchEngine:
    torch.manual_seed(0)
    model = GPT(TINY)
    cfg = load_config("gpt2-tiny", ["compile=true", "precision=fp32"])[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return TorchEngine(model, model, optimizer, cfg, choose("fp32", torch.device("cpu")), accum, ddp=False,
                       cuda_graphs=cuda_graphs)


def _one_step(engine: TorchEngine, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    for i, x in enumerate(batches):
        engine.micro_step(x, x, is_last=i == len(batches) - 1)
    grads = [p.grad.clone() for p in engine.raw_model.parameters()]
    engine.step()
    return grads


def test_accumulating_into_kept_buffers_gives_the_gradients_of_the_default_path():
    torch.manual_seed(1)
    batches = [torch.randint(0, TINY.vocab_size, (2, 16)) for _ in range(4)]
    kept, freed = _engine(True, accum=4), _engine(False, accum=4)
    buffers = [p.grad for p in kept.raw_model.parameters()]
    assert kept.kept_grads is not None and freed.kept_grads is None
    assert all(g is not None and not g.any() for g in buffers)
    for _ in range(2):
        for a, b in zip(_one_step(kept, batches), _one_step(freed, batches)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert [p.grad for p in kept.raw_model.parameters()] == buffers  # the same tensors, zeroed after each step
    assert all(not g.any() for g in buffers) and all(p.grad is None for p in freed.raw_model.parameters())


def test_without_accumulation_the_graphs_keep_their_gradients():
    assert _engine(True, accum=1).kept_grads is None
