"""AdamW (torch's fused CUDA kernel on GPUs, its foreach path on CPU) and the cosine schedule."""

from __future__ import annotations

import math

import torch

from gptforge.core.findings import Finding, Severity
from gptforge.train.config import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay the weight matrices of linear layers; never biases, LayerNorm gains or the embedding tables
    (GPT-2 / minGPT convention; the token table is also the tied output matrix)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool) -> tuple[torch.optim.Optimizer, Finding]:
    """AdamW over MODEL's parameter groups and the run's note on it; FUSED: torch's fused CUDA kernel (gptforge.accel's choice)."""
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            fused=fused, foreach=None if fused else True)
    return opt, Finding("optimizer", Severity.INFO, f"optimizer: torch AdamW ({'fused CUDA kernel' if fused else 'foreach'})")


def folds_clipping(optimizer: torch.optim.Optimizer) -> bool:
    """Whether OPTIMIZER scales the gradients itself: torch's fused Adam/AdamW divides each gradient by
    its ``grad_scale`` attribute inside the kernel (the protocol GradScaler unscales by)."""
    return (isinstance(optimizer, torch.optim.Adam) and bool(optimizer.defaults.get("fused"))
            and getattr(optimizer, "_step_supports_amp_scaling", False))


def clipped_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip the gradients' total norm to MAX_NORM (math.inf: no clipping), take the optimizer step, and
    return the norm before clipping.

    clip_grad_norm_ multiplies every gradient by min(max_norm / (norm + 1e-6), 1) in a pass of its own;
    where the optimizer folds clipping in, it divides by the inverse inside its kernel instead, which
    saves that pass over the gradients (a read and a write of every gradient a step).
    """
    if not folds_clipping(optimizer):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return norm
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
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
