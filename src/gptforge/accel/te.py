"""FP8 training through TransformerEngine (``accel = "te-fp8"``; sm_89 and newer).

Each block's LayerNorms and Linear layers become TransformerEngine's (te.LayerNorm, te.Linear; same
weights, same parameter names), and each block runs under TE's FP8 autocast with the HYBRID format (E4M3 in
the forward pass, E5M2 for gradients) and delayed scaling (each tensor's scale from the amax history of
earlier steps). The embeddings and the tied output layer stay as they are. On GPT-2 124M this route is
slower than bf16 (BENCHMARKS.md, section "Levers"); it is here for those who come for TE.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from gptforge.model.gpt import Block

MODULE = "transformer_engine.pytorch"


def fp8_autocast():
    """TE's FP8 autocast context for the HYBRID delayed-scaling recipe (TE 2.x's ``autocast(recipe=)``, else
    the older ``fp8_autocast(fp8_recipe=)``)."""
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.HYBRID)
    new = getattr(te, "autocast", None)
    if new is not None and "recipe" in inspect.signature(new).parameters:
        return new(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def _te_twin(module: nn.Module) -> nn.Module:
    """MODULE's TransformerEngine counterpart holding a copy of its weights."""
    import transformer_engine.pytorch as te

    if isinstance(module, nn.LayerNorm):
        twin = te.LayerNorm(module.normalized_shape[0], eps=module.eps, device=module.weight.device)
    else:
        twin = te.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                         device=module.weight.device)
    with torch.no_grad():
        for name, param in module.named_parameters():
            getattr(twin, name).copy_(param)
    return twin


class FP8Block(Block):
    """The model's block, its LayerNorms and Linear layers TE's, run under TE's FP8 autocast."""

    def __init__(self, block: Block):
        nn.Module.__init__(self)
        self.ln_1, self.attn, self.ln_2, self.mlp = block.ln_1, block.attn, block.ln_2, block.mlp
        for parent in (self, self.attn, self.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, (nn.LayerNorm, nn.Linear)):
                    twin = _te_twin(child)
                    twin.residual_out = getattr(child, "residual_out", False)
                    setattr(parent, name, twin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with fp8_autocast():
            return super().forward(x)


def use_te_fp8(model: nn.Module) -> int:
    """Swap MODEL's blocks for FP8Blocks; returns how many Linear layers run in FP8."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FP8Block(block)
    import transformer_engine.pytorch as te

    return sum(isinstance(m, te.Linear) for m in model.blocks.modules())
