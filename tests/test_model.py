"""GPT-2 model: shapes, padding, tied embeddings, GPT-2 init, causality, FLOP formula, packaged sizes."""

from __future__ import annotations

import math

import pytest
import torch

from gptforge.model.config import ModelConfig, pad_vocab
from gptforge.model.gpt import GPT
from gptforge.train.config import load_config


def tiny(vocab: int = 1000, **kw) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=vocab)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("vocab,padded", [(50257, 50304), (8192, 8192), (1, 64), (65, 128)])
def test_vocab_is_padded_to_a_multiple_of_64(vocab, padded):
    assert pad_vocab(vocab) == padded
    model = GPT(tiny(vocab))
    assert model.wte.weight.shape[0] == padded


def test_embeddings_are_tied_and_counted_once():
    model = GPT(tiny())
    assert model.lm_head.weight is model.wte.weight
    distinct = {id(p) for p in model.parameters()}
    assert len(distinct) == len(list(model.parameters()))


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    cfg = tiny(num_layers=8, hidden_size=256)
    model = GPT(cfg)
    def std(weights) -> float:
        return torch.cat([w.flatten() for w in weights]).std().item()

    for plain in ([b.mlp.fc.weight for b in model.blocks], [b.attn.qkv.weight for b in model.blocks],
                  [model.wte.weight], [model.wpe.weight]):
        assert std(plain) == pytest.approx(0.02, rel=0.05)
    for residual in ([b.mlp.proj.weight for b in model.blocks], [b.attn.proj.weight for b in model.blocks]):
        assert std(residual) == pytest.approx(0.02 / math.sqrt(2 * cfg.num_layers), rel=0.05)
    assert all(torch.count_nonzero(b.attn.qkv.bias) == 0 for b in model.blocks)
    assert torch.equal(model.ln_f.weight, torch.ones(256)) and torch.count_nonzero(model.ln_f.bias) == 0


def test_attention_is_causal():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 1000, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 1000
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.equal(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_initial_loss_is_near_uniform_and_sequence_bound_enforced():
    torch.manual_seed(0)
    model = GPT(tiny())
    idx, targets = torch.randint(0, 1000, (2, 4, 32))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(1000)) < 0.05  # uniform over the 1000 real tokens, not the 1024 rows
    with pytest.raises(ValueError, match="position table"):
        model(torch.zeros((1, 33), dtype=torch.long))


def test_padded_vocab_rows_never_reach_the_loss():
    torch.manual_seed(0)
    model = GPT(tiny(vocab=70)).eval()
    idx, targets = torch.randint(0, 70, (2, 2, 16))
    _, loss = model(idx, targets)
    assert model(idx)[0].shape == (2, 16, 70)
    with torch.no_grad():
        model.wte.weight[70:] = 10.0  # padded rows with the largest logits
    _, again = model(idx, targets)
    assert torch.equal(loss, again)


def test_generate_never_emits_padding_rows():
    torch.manual_seed(0)
    model = GPT(tiny(vocab=70)).eval()
    with torch.no_grad():
        model.wte.weight[70:] = 10.0  # make padded rows the most likely logits
    out = model.generate(torch.zeros((1, 1), dtype=torch.long), 20, temperature=1.0, top_k=5)
    assert out.shape == (1, 21) and int(out.max()) < 70


def test_palm_flops_formula():
    cfg = tiny()
    model = GPT(cfg)
    n = model.num_params()
    assert n == model.num_params(include_positions=True) - 32 * 64
    assert model.flops_per_token(32) == 6 * n + 12 * 2 * 4 * 16 * 32


@pytest.mark.parametrize("name,params", [("gpt2-124m", 124_475_904), ("gpt2-350m", 354_871_296),
                                         ("gpt2-774m", 774_090_240), ("gpt2-1.5b", 1_557_686_400)])
def test_packaged_sizes_match_gpt2(name, params):
    """Parameter counts of GPT-2 with the vocabulary padded 50257 -> 50304 (GPT-2 paper counts + 47 x width)."""
    cfg, _ = load_config(name)
    with torch.device("meta"):
        model = GPT(cfg.model_config(50257))
    assert model.num_params(include_positions=True) == params
