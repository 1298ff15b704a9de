"""The throughput levers are config keys: checked values, wired into the model, optimizer and compile call."""

from __future__ import annotations

import pytest
import torch

from gptforge.errors import UsageError
from gptforge.model import GPT, ModelConfig
from gptforge.model.layers import ATTENTION_BACKENDS, LayerBackend, resolve_backend
from gptforge.train.config import KNOWN_KEYS, TrainConfig, load_config, validate
from gptforge.train.optim import build_optimizer

CFG = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, max_position_embeddings=16, vocab_size=100)


def test_lever_keys_exist_with_the_old_behaviour_as_default():
    cfg = TrainConfig()
    assert {"compile-mode", "attention-backend", "fused-loss", "loss-chunk-tokens", "fused-adamw", "fp8-recipe"} <= set(KNOWN_KEYS)
    assert (cfg.compile_mode, cfg.attention_backend, cfg.fused_loss, cfg.fused_adamw, cfg.fp8_recipe) == \
        ("default", "auto", False, True, "delayed")


@pytest.mark.parametrize("override, says", [
    ("compile-mode=fast", "compile-mode: 'fast' is not one of default, max-autotune-no-cudagraphs, reduce-overhead"),
    ("attention-backend=flash3", "attention-backend: 'flash3' is not one of auto, flash, cudnn, efficient, math"),
    ("fp8-recipe=mxfp8", "fp8-recipe: 'mxfp8' is not one of delayed, current"),
    ("loss-chunk-tokens=0", "loss-chunk-tokens: must be positive"),
])
def test_bad_lever_values_are_usage_errors(override, says):
    cfg, _ = load_config("gpt2-tiny", [override])
    with pytest.raises(UsageError, match="^" + says.replace("(", r"\(")):
        validate(cfg)


def test_resolve_backend_carries_attention_and_loss_choice_with_notes():
    b = resolve_backend(attention="cudnn", loss_chunk=4096)
    assert (b.attention, b.loss_chunk) == ("cudnn", 4096)
    assert any("cudnn kernel" in n for n in b.notes) and any("4096 tokens per chunk" in n for n in b.notes)
    assert resolve_backend().notes == []


def test_transformer_engine_asked_for_without_it_falls_back_with_a_note():
    try:
        import transformer_engine.pytorch  # noqa: F401
        pytest.skip("TransformerEngine is installed here")
    except Exception:
        pass
    b = resolve_backend(transformer_engine=True)
    assert b.linear == "torch" and "asked for but not importable (ModuleNotFoundError: " in b.notes[0]


def test_apex_layernorm_asked_for_without_apex_falls_back_and_says_why():
    from gptforge.model.layers import importable

    if importable("apex.normalization"):
        pytest.skip("apex is installed here")
    b = resolve_backend(apex_layernorm=True)
    assert b.layer_norm == "torch"
    assert "apex FusedLayerNorm asked for but apex is not importable (ModuleNotFoundError: " in b.notes[0]


@pytest.mark.parametrize("kernel", ["flash", "math"])
def test_pinned_attention_kernel_computes_the_same_as_auto(kernel):
    torch.manual_seed(0)
    auto = GPT(CFG)
    pinned = GPT(CFG, LayerBackend(attention=kernel))
    pinned.load_state_dict(auto.state_dict())
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    torch.testing.assert_close(pinned(x)[0], auto(x)[0], rtol=1e-5, atol=1e-5)


def test_a_kernel_that_cannot_run_raises_instead_of_silently_falling_back():
    assert set(ATTENTION_BACKENDS) >= {"cudnn", "flash"}
    model = GPT(CFG, LayerBackend(attention="cudnn"))  # no cuDNN attention on a CPU tensor
    with pytest.raises(RuntimeError):
        model(torch.randint(0, CFG.vocab_size, (1, 8)))


@pytest.mark.parametrize("fused, expect", [(True, "torch AdamW (foreach, CPU)"), (False, "torch AdamW (foreach, CPU)")])
def test_fused_adamw_key_on_cpu_keeps_foreach(fused, expect):
    cfg = TrainConfig(fused_adamw=fused)
    opt, note = build_optimizer(GPT(CFG), cfg, torch.device("cpu"))
    assert note == expect and opt.defaults["fused"] in (None, False)


def test_compile_mode_reaches_torch_compile(tmp_path, monkeypatch, train_data_cache):
    from gptforge.train import loop

    seen, real_compile = {}, torch.compile

    def recording_compile(model, **kwargs):  # the real (lazy) torch.compile, its arguments recorded
        seen.update(kwargs)
        return real_compile(model, **kwargs)

    monkeypatch.setattr(loop.torch, "compile", recording_compile)
    cfg, _ = load_config("gpt2-tiny", ["compile=true", "compile-mode=max-autotune-no-cudagraphs", "train-iters=2",
                                       "lr-warmup-iters=1", f"data-cache-dir={train_data_cache}"])
    trainer = loop.Trainer(cfg, loop.RunOptions(run_dir=tmp_path / "run", device="cpu"))
    trainer.preflight()
    trainer.setup()
    trainer.metrics.close()
    assert seen["mode"] == "max-autotune-no-cudagraphs"
    assert type(trainer.engine.model).__name__ == "OptimizedModule"
    assert any("mode max-autotune-no-cudagraphs" in n for n in trainer.notes)
