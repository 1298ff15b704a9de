"""Whether the sizes a run asks for can fit this machine's memory at all, checked before anything is built.

A size key set far out of range (a layer count of twenty digits, a width of millions, a batch of a hundred
thousand sequences) would otherwise build layers for minutes or die in the allocator with a traceback. The
figure here is a lower bound of what training needs (what remains when every memory lever is on), so a run
it refuses could not have run; the key named is the one whose reduction to 1 would save the most.
"""

from __future__ import annotations

import contextlib
import os

from gptforge.errors import GptforgeError, UsageError

OPTIMIZER_BYTES = 16  # per parameter: fp32 weights, gradients and Adam's two moments (ZeRO-3 shards all four)
ACTIVATION_BYTES = 34  # per token, width and layer, in 16 bits, without attention scores (Korthikanti et al. 2022)
LOGIT_BYTES = 4  # per token and vocabulary entry, fp32, for the tokens whose logits exist at once


def parameters(num_layers: int, hidden_size: int, max_position_embeddings: int, vocab_size: int) -> int:
    """GPT-2's parameter count: embeddings, per layer attention (4h^2 + 4h), MLP (8h^2 + 5h), two norms (4h),
    and the final norm; the output layer is tied to the token embedding."""
    return (vocab_size + max_position_embeddings) * hidden_size + num_layers * (12 * hidden_size ** 2 + 13 * hidden_size) \
        + 2 * hidden_size


LOWER_SIZES = "lower micro-batch-size (gradient accumulation keeps global-batch-size), seq-length or the model's size keys"
SIZE_KEYS = ("num-layers", "hidden-size", "max-position-embeddings", "micro-batch-size", "seq-length")


def training_bytes(sizes: dict, *, vocab_size: int, logit_tokens: int, world_size: int) -> int:
    """At least what one rank needs to train: ``sizes`` holds SIZE_KEYS; ``logit_tokens``: how many tokens'
    logits exist at once (0: the whole micro batch's); ``world_size`` 0: the parameters and their optimizer
    state may leave the device altogether (DeepSpeed can offload them)."""
    h, layers, tokens = sizes["hidden-size"], sizes["num-layers"], sizes["micro-batch-size"] * sizes["seq-length"]
    params = parameters(layers, h, sizes["max-position-embeddings"], vocab_size)
    logits = min(logit_tokens, tokens) if logit_tokens else tokens
    on_device = OPTIMIZER_BYTES * params // world_size if world_size else 0
    return on_device + ACTIVATION_BYTES * tokens * h * layers + LOGIT_BYTES * logits * vocab_size


def check_run(cfg, device, world_size: int, vocab_size: int = 0, logit_tokens: int = 0, *, deepspeed: bool) -> None:
    """``check_training_fits`` for a run's config; before the data is read the vocabulary is not known (0)."""
    sizes = {key: getattr(cfg, key.replace("-", "_")) for key in SIZE_KEYS}
    check_training_fits(sizes, device, vocab_size=vocab_size, logit_tokens=logit_tokens,
                        world_size=0 if deepspeed else world_size)


def memory_bytes(device) -> tuple[int, str]:
    """(bytes, name) of the memory a run on ``device`` trains in: the GPU's, else the machine's RAM."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory, "GPU memory"
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "memory"


def check_training_fits(sizes: dict, device, *, vocab_size: int = 0, logit_tokens: int = 0, world_size: int = 1) -> None:
    """Refuse, naming the key, sizes whose training cannot fit ``device``'s memory."""
    need = training_bytes(sizes, vocab_size=vocab_size, logit_tokens=logit_tokens, world_size=world_size)
    have, where = memory_bytes(device)
    if need <= have:
        return
    key = max(sizes, key=lambda k: need - training_bytes({**sizes, k: 1}, vocab_size=vocab_size,
                                                         logit_tokens=logit_tokens, world_size=world_size))
    raise UsageError(key, f"{_short(sizes[key])} needs at least {_amount(need)} to train, more than the "
                     f"{_amount(have)} of {where} here", f"lower {key}, or another size key")


@contextlib.contextmanager
def out_of_memory_is_one_line():
    """An allocation that fails during training (sizes that pass the lower bound above and still do not fit)
    is one line, not the allocator's traceback."""
    import torch

    try:
        yield
    except (torch.OutOfMemoryError, MemoryError) as err:
        raise GptforgeError(f"out of memory while training ({_first_line(err)})", LOWER_SIZES) from None
    except RuntimeError as err:
        if "can't allocate memory" not in str(err):
            raise
        raise GptforgeError(f"out of memory while training ({_first_line(err)})", LOWER_SIZES) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]


def model_problem(values: dict) -> str | None:
    """What makes a stored model shape unbuildable here (a damaged or crafted checkpoint), or None."""
    keys = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "vocab_size")
    for key in keys:
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"{key} is {_short(value)}, not a positive integer"
    if values["hidden_size"] % values["num_attention_heads"]:
        return "hidden_size is not divisible by num_attention_heads"
    dropout = values.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        return f"dropout is {_short(dropout)}, outside [0, 1)"
    weights = 4 * parameters(*(values[k] for k in keys[:2]), values["max_position_embeddings"], values["vocab_size"])
    have, _ = memory_bytes(None)
    if weights > have:
        return f"its weights alone need {_amount(weights)}, more than the {_amount(have)} of memory here"
    return None


def _amount(count: int) -> str:
    if count >= 1 << 70:
        return f"about 2^{count.bit_length() - 1} bytes"
    for unit, exponent in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << exponent:
            return f"{count / (1 << exponent):.1f} {unit}"
    return f"{count} bytes"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} characters)"

