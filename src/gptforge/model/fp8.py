"""FP8 training: TransformerEngine's recipes and autocast for te.Linear layers, or torchao's Float8Linear.

delayed: the scale of each tensor comes from the amax history of earlier steps (one fused amax/scale
update per step; cheapest, but a sudden outlier overflows until the history catches up).
current: each tensor is scaled by its own amax, computed just before the cast (one extra reduction
per tensor; robust to outliers).
Both use HYBRID: E4M3 in the forward pass, E5M2 for gradients.

torchao (float8=tensorwise|rowwise): nn.Linear layers become Float8Linear, scaled dynamically from
each tensor's amax (per tensor, or per row); the casts are plain torch ops that torch.compile fuses
into the neighbouring kernels, where TE runs them as separate kernels.
"""

from __future__ import annotations

import inspect


def make_recipe(name: str):
    from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format

    if name == "delayed":
        return DelayedScaling(fp8_format=Format.HYBRID)
    if name == "current":
        return Float8CurrentScaling(fp8_format=Format.HYBRID)
    raise ValueError(f"unknown FP8 recipe {name!r} (delayed or current)")


def autocast_factory(name: str):
    """A zero-argument callable returning TE's FP8 autocast context for the recipe.

    TE 2.x renamed ``fp8_autocast(fp8_recipe=)`` to ``autocast(recipe=)``; the new name is used when present.
    """
    import transformer_engine.pytorch as te

    recipe = make_recipe(name)
    new = getattr(te, "autocast", None)
    if new is not None and "recipe" in inspect.signature(new).parameters:
        return lambda: new(enabled=True, recipe=recipe)
    return lambda: te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def convert_torchao(model, recipe: str) -> int:
    """Swap the transformer blocks' nn.Linear layers for torchao's Float8Linear; returns how many.

    The output layer stays bf16: its weight is the tied token embedding, and the logits feed a softmax.
    """
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    swapped = []

    def in_blocks(module, fqn: str) -> bool:
        wanted = isinstance(module, nn.Linear) and fqn != "lm_head" and module.weight.shape[0] % 16 == 0 \
            and module.weight.shape[1] % 16 == 0  # _scaled_mm needs both dims divisible by 16
        if wanted:
            swapped.append(fqn)
        return wanted

    convert_to_float8_training(model, module_filter_fn=in_blocks, config=Float8LinearConfig.from_recipe_name(recipe))
    return len(swapped)
