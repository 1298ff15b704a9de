"""Shape of a GPT-2 model. Everything a checkpoint must agree on lives here."""

from __future__ import annotations

from dataclasses import asdict, dataclass

VOCAB_MULTIPLE = 64


def pad_vocab(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Vocabulary rounded up to a multiple of 64: tensor-core friendly logits (nanoGPT measured ~25%)."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int
    vocab_size: int  # the tokenizer's; the embedding table holds padded_vocab_size rows
    dropout: float = 0.0

    @property
    def padded_vocab_size(self) -> int:
        return pad_vocab(self.vocab_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def shape(self) -> dict:
        """The fields that decide parameter shapes (dropout does not)."""
        fields = asdict(self)
        fields.pop("dropout")
        fields["padded_vocab_size"] = self.padded_vocab_size
        return fields
