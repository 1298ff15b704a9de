"""GPT-2 model: configuration, layers (torch-native or accelerated), the network."""

from gptforge.model.config import ModelConfig, pad_vocab

__all__ = ["GPT", "ModelConfig", "pad_vocab"]


def __getattr__(name):
    # GPT on first use: reading or checking a config (gptforge train --list-keys, a bad key) needs no torch
    if name == "GPT":
        from gptforge.model.gpt import GPT

        return GPT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
