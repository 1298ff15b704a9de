"""`gptforge sample`'s options, checked before a checkpoint (and torch) is loaded."""

from __future__ import annotations

import math

from gptforge.errors import UsageError
from gptforge.train.config import check_seed

FLOAT32_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps, without importing torch


def check_sampling(max_new_tokens: int | None, temperature: float, top_k: int | None, seed: int,
                   prompt: str = "") -> None:
    if max_new_tokens is not None and max_new_tokens <= 0:
        raise UsageError("--max-new-tokens", f"must be positive, got {max_new_tokens}", "e.g. --max-new-tokens 200")
    if not 0 <= temperature < math.inf:
        raise UsageError("--temperature", f"must be a finite number >= 0, got {temperature}", "0 means greedy, 0.8 is typical")
    if 0 < temperature < FLOAT32_EPS:  # logits divided by it overflow to inf, softmax to nan
        raise UsageError("--temperature", f"{temperature} is below float32's resolution",
                         "use --temperature 0 for greedy decoding, or a typical 0.8")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # a byte of the command line that is not UTF-8, kept as a lone surrogate
        raise UsageError("--prompt", f"character {err.start} ({prompt[err.start]!r}) is a byte that is not UTF-8",
                         "pass the prompt as UTF-8 text") from None
    check_seed(seed, "--seed")
    if top_k is not None and top_k < 0:
        raise UsageError("--top-k", f"must be >= 0, got {top_k}", "0 turns the filter off, 50 is typical")
