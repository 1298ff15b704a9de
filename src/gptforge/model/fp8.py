"""TransformerEngine FP8: the scaling recipe and the autocast context that applies it to te.Linear layers.

delayed: the scale of each tensor comes from the amax history of earlier steps (one fused amax/scale
update per step; cheapest, but a sudden outlier overflows until the history catches up).
current: each tensor is scaled by its own amax, computed just before the cast (one extra reduction
per tensor; robust to outliers).
Both use HYBRID: E4M3 in the forward pass, E5M2 for gradients.
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
