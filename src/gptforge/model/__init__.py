"""GPT-2 model: configuration, layers (torch-native or accelerated), the network."""

from gptforge.model.config import ModelConfig, pad_vocab
from gptforge.model.gpt import GPT

__all__ = ["GPT", "ModelConfig", "pad_vocab"]
