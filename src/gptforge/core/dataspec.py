"""How a training data set is described, for the data pipeline and the training config alike: its
split weights ("949,50,1") and the kinds of tokenizer it can be prepared with."""

from __future__ import annotations

import math

from gptforge.errors import UsageError

SPLIT_NAMES = ("train", "valid", "test")
TOKENIZER_KINDS = ("gpt2", "bytelevel")


def split_weights(split: str, flag: str = "--split") -> list[float]:
    """``"949,50,1"`` (or ``949/50/1``) -> three finite non-negative weights, not all 0 (missing ones are 0)."""
    fix = "e.g. 949,50,1"
    try:
        parts = [float(x) for x in split.replace("/", ",").split(",")]
    except ValueError:
        raise UsageError(flag, f"{split!r} is not comma-separated numbers", fix) from None
    if len(parts) > 3 or not all(math.isfinite(p) and p >= 0 for p in parts) or sum(parts) <= 0:
        raise UsageError(flag, f"{split!r} needs up to three finite, non-negative weights, not all 0", fix)
    return parts + [0.0] * (3 - len(parts))
