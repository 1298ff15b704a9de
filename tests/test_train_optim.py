"""AdamW parameter groups: weight decay on linear-layer matrices only."""

from __future__ import annotations

import torch

from gptforge.model import GPT, ModelConfig
from gptforge.train.optim import param_groups


def test_decay_skips_biases_layernorms_and_embeddings():
    model = GPT(ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=2, max_position_embeddings=16,
                            vocab_size=100))
    decay, no_decay = param_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    expected = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert decayed == {f"{n}.weight" for n in expected}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "blocks.0.attn.qkv.bias"} <= skipped
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
