"""``hopper-kernels``: the fastest configuration with loss parity, applied where every one of its kernels runs.

The keys are ``gptforge.model.kernels.HOPPER_KEYS`` (BENCHMARKS.md: 1.30x nanoGPT at 124M, its held-out
loss the defaults'). ``auto`` (the GPT-2 configs) applies them on an sm_90 GPU where FA4, quack, the CuTe DSL
and cuDNN can all run and the step is compiled, and leaves the config alone elsewhere; ``on`` applies them or
stops with what is missing; ``off`` never does. A key the config file or the command line sets keeps its value
either way.

Their kernels pay inside the compiled step's CUDA graphs: run eagerly (``compile=false``, or under DeepSpeed,
which runs it without CUDA graphs) each launch goes through their Python wrappers, and the step is host-bound and
slower than without them (18% fewer tokens/s under DeepSpeed ZeRO-2 on an H100, BENCHMARKS.md run 82).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gptforge.errors import UsageError
from gptforge.model import kernels
from gptforge.train.config import TrainConfig, attr_name, parse_override

WHERE_THEY_ARE = "`pixi run -e hopper ...` has them"


def apply_hopper_keys(cfg: TrainConfig, device: torch.device, deepspeed: bool = False) -> tuple[TrainConfig, str | None]:
    """CFG with the Hopper keys it does not set itself where hopper-kernels asks for them here, and the note
    saying what was done (None where there is nothing to say: off, or auto away from an sm_90 GPU). DEEPSPEED:
    the step runs under the DeepSpeed engine, without CUDA graphs."""
    choice = cfg.hopper_kernels
    if choice == "off":
        return cfg, None
    blocker = kernels.hopper_keys_blocker(device)
    if blocker is not None:
        if choice == "on":
            raise UsageError("hopper-kernels", f"on, but the Hopper kernels cannot run here: {blocker}",
                             f"hopper-kernels=auto trains without them where they cannot run; {WHERE_THEY_ARE}")
        return cfg, (f"hopper-kernels=auto: off ({blocker}; {WHERE_THEY_ARE})" if kernels.hopper(device) else None)
    eager = eager_step(cfg, deepspeed)
    if eager is not None and choice == "auto":
        return cfg, (f"hopper-kernels=auto: off ({eager}; their kernels pay inside the compiled step's CUDA graphs, "
                     "eagerly the step is slower with them; hopper-kernels=on applies them regardless)")
    pairs = [(text, *parse_override(text)) for text in kernels.HOPPER_KEYS]  # ("k=v", key, value)
    applied = [(text, key, value) for text, key, value in pairs if key not in cfg.given]
    resolved = replace(cfg, **{attr_name(key): value for _, key, value in applied})
    resolved.given = cfg.given
    kept = [f"{key}={shown(getattr(cfg, attr_name(key)))}" for _, key, _ in pairs if key in cfg.given]
    note = f"hopper-kernels={choice}: " + (" ".join(text for text, _, _ in applied) or "none of its keys")
    note += f" (kept as given: {' '.join(kept)})" if kept else ""
    return resolved, note + (f"; {eager}: their kernels run eagerly, slower than without them" if eager else "")


def eager_step(cfg: TrainConfig, deepspeed: bool) -> str | None:
    """Why the training step runs without CUDA graphs, or None when torch.compile may capture it in them."""
    if deepspeed:
        return "DeepSpeed runs the step without CUDA graphs"
    return None if cfg.compile else "compile=false"


def shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
