"""AdamW (torch fused on CUDA, with float32 masters of bf16 weights when asked for, apex FusedAdam when installed
and asked for) and the cosine schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gptforge.model.layers import importable
from gptforge.train.adamw_bf16 import kernel_available
from gptforge.train.config import TrainConfig
from gptforge.train.master import MasterAdamW


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay the weight matrices of linear layers; never biases, LayerNorm gains or the embedding tables
    (GPT-2 / minGPT convention; the token table is also the tied output matrix)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class StepShape:
    """What the optimizer's choice depends on beyond the config: the run's precision, whether DDP or
    DeepSpeed runs the step, and whether micro batches accumulate."""

    precision: str = "fp32"
    ddp: bool = False
    deepspeed: bool = False
    accumulate: bool = False


def bf16_weights_blocker(cfg: TrainConfig, device: torch.device, shape: StepShape) -> str | None:
    """Why bf16-weights cannot apply to this run (None: it can)."""
    if device.type != "cuda" or shape.precision != "bf16":
        return f"the run is {shape.precision} on {device.type}, not bf16 on a GPU"
    if shape.deepspeed:
        return "DeepSpeed keeps the weights itself"
    if shape.ddp:
        return "DDP would all-reduce the gradients in bf16"
    if cfg.apex_fused_adam or cfg.transformer_engine or cfg.float8 != "off":
        return "apex FusedAdam, TransformerEngine and torchao float8 keep float32 weights"
    return None


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device,
                    shape: StepShape = StepShape()) -> tuple[torch.optim.Optimizer, str]:
    groups = param_groups(model, cfg.weight_decay)
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    note = ""
    fused = device.type == "cuda" and cfg.fused_adamw
    if cfg.bf16_weights:
        blocker = bf16_weights_blocker(cfg, device, shape)
        if blocker is None:
            low = groups[0]["params"]  # the linear layers' weight matrices: the GEMMs' operands
            opt = MasterAdamW(groups, low, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, accumulate=shape.accumulate,
                              fused=fused)
            kernel = "Triton kernel" if kernel_available(device) else "torch ops"
            return opt, (f"AdamW with float32 master weights, the {len(low)} weight matrices bf16 in the model "
                         f"(bf16-weights; {kernel}; the other parameters: torch AdamW)")
        off = "asked for but off" if "bf16-weights" in cfg.given else "(hopper-kernels) off"
        note = f"bf16-weights {off} ({blocker}); "
    if cfg.apex_fused_adam:
        if device.type == "cuda" and importable("apex.optimizers"):
            from apex.optimizers import FusedAdam

            return FusedAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, adam_w_mode=True), note + "apex FusedAdam"
        note += "apex FusedAdam asked for but not usable here (needs apex and a GPU); "
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, fused=fused,
                            foreach=None if fused else True)
    how = "fused CUDA kernel" if fused else "foreach, CPU" if device.type == "cpu" else "foreach (fused-adamw=false)"
    return opt, note + f"torch AdamW ({how})"


def folds_clipping(optimizer: torch.optim.Optimizer) -> bool:
    """Whether OPTIMIZER scales the gradients itself: torch's fused Adam/AdamW divides each gradient by
    its ``grad_scale`` attribute inside the kernel (the protocol GradScaler unscales by), and so does
    MasterAdamW."""
    if isinstance(optimizer, MasterAdamW):
        return True
    return (isinstance(optimizer, torch.optim.Adam) and bool(optimizer.defaults.get("fused"))
            and getattr(optimizer, "_step_supports_amp_scaling", False))


def total_norm(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the gradients OPTIMIZER's next step applies, accumulated in float32 (bf16 ones too)."""
    if isinstance(optimizer, MasterAdamW):
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in optimizer.gradients():
            by_dtype.setdefault(grad.dtype, []).append(grad)
        # one multi-tensor kernel per dtype: a list of mixed dtypes takes a kernel per tensor
        norms = [n for grads in by_dtype.values() for n in torch._foreach_norm(grads, 2.0, dtype=torch.float32)]
        return torch.linalg.vector_norm(torch.stack(norms))
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)


def clipped_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the gradients' total norm to MAX_NORM (math.inf: no clipping), take the optimizer step, and
    return the norm before clipping.

    clip_grad_norm_ multiplies every gradient by min(max_norm / (norm + 1e-6), 1) in a pass of its own;
    where the optimizer folds clipping in, it divides by the inverse inside its kernel instead, which
    saves that pass over the gradients (about 1 GB of memory traffic a step at 124M parameters).
    """
    if not folds_clipping(optimizer):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return norm
    norm = total_norm(optimizer, params)
    if math.isfinite(max_norm):
        optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
    try:
        optimizer.step()
    finally:
        optimizer.__dict__.pop("grad_scale", None)
    return norm


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to lr, cosine decay to min-lr at lr-decay-iters, then flat (nanoGPT's schedule)."""
    warmup, decay = cfg.warmup_iters(), cfg.decay_iters()
    if step < warmup:
        return cfg.lr * (step + 1) / (warmup + 1)
    if step >= decay:
        return cfg.min_lr
    progress = (step - warmup) / max(1, decay - warmup)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg) / cfg.lr)
