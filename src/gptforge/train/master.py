"""AdamW over bf16 model weights with float32 master weights (``bf16-weights = true``).

Under bf16 autocast every step casts each float32 weight matrix to bf16 for its GEMMs and each bf16 weight
gradient back to float32 for AdamW: for GPT-2 124M about 0.6 ms of a 54 ms step in cast kernels, besides
AdamW reading float32 gradients (BENCHMARKS.md). Here the model holds those matrices in bf16 (the values
autocast's cast gives) and this optimizer holds their float32 masters: it reads the bf16 gradients as they
come and writes the bf16 weights with the masters (train/adamw_bf16.py). Every other parameter (embeddings,
biases, LayerNorm gains) stays float32 and goes through torch's AdamW as before.

With gradient accumulation each micro batch's bf16 gradient is added into a float32 sum as it arrives (a
hook on the parameter), as autograd adds float32 gradients, so the sum is the one a float32 weight gets.
A checkpoint's model state carries the masters, so `model.pt` stays float32.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam

from gptforge.train.adamw_bf16 import Hyper, adamw_bf16_step

MOMENTS = ("exp_avg", "exp_avg_sq")


class MasterAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) whose parameters in LOW become bf16 in the model, their float32 masters
    kept here. ACCUMULATE: gradients of several backward passes are summed (in float32) before a step.
    Gradient clipping folds in as in torch's fused AdamW: a ``grad_scale`` attribute divides every gradient."""

    def __init__(self, groups: list[dict], low: Iterable[torch.Tensor], *, lr: float, betas: tuple[float, float],
                 eps: float, accumulate: bool, fused: bool):
        # "fused": torch's loader then puts the other parameters' step counts on the GPU, where its fused kernel reads them
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0, "fused": fused})
        self.fused = fused
        self.low = {id(p) for p in low}
        self.sums: dict[int, torch.Tensor] = {}
        for p in self.params():
            self.init_state(p)
            if self.is_low(p):
                p.data = p.data.to(torch.bfloat16)
                if accumulate:
                    self.sums[id(p)] = torch.zeros_like(p, dtype=torch.float32)
                    p.register_post_accumulate_grad_hook(self.take_grad)

    def params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def is_low(self, p: torch.Tensor) -> bool:
        return id(p) in self.low

    def init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        if self.is_low(p):
            state["master"] = p.detach().float().clone()
            state["step"] = torch.tensor(0.0)
        else:
            state["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if self.fused
                             else torch.tensor(0.0))
        for name in MOMENTS:
            state[name] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)

    def take_grad(self, p: torch.Tensor) -> None:
        """Add P's bf16 gradient of this backward into its float32 sum and let go of it."""
        self.sums[id(p)].add_(p.grad)
        p.grad = None

    def gradients(self) -> list[torch.Tensor]:
        """The gradients the next step applies (the float32 sums where it accumulates), for the norm."""
        grads = []
        for p in self.params():
            grad = self.sums.get(id(p), p.grad)
            if grad is not None:
                grads.append(grad)
        return grads

    def accumulated(self, p: torch.Tensor) -> bool:
        """Whether P's gradients go to a float32 sum here (then P needs no .grad buffer of its own)."""
        return id(p) in self.sums

    @torch.no_grad()
    def step(self, closure=None):
        scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            rest = [p for p in group["params"] if not self.is_low(p) and p.grad is not None]
            for p in group["params"]:
                grad = self.sums.get(id(p), p.grad)
                if self.is_low(p) and grad is not None:
                    state = self.state[p]
                    state["step"] += 1
                    hyper = Hyper(group["lr"], group["weight_decay"], beta1, beta2, group["eps"], int(state["step"]))
                    adamw_bf16_step(p, grad, state["master"], state["exp_avg"], state["exp_avg_sq"], hyper, scale)
            if rest:
                states, grads = [self.state[p] for p in rest], [p.grad for p in rest]
                if scale is not None and not self.fused:  # torch's foreach AdamW takes no grad_scale
                    torch._foreach_div_(grads, scale)
                adam(rest, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                     [], [s["step"] for s in states], foreach=None if self.fused else True, fused=self.fused or None,
                     grad_scale=scale if self.fused else None, decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                     lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.sums:
            torch._foreach_zero_(list(self.sums.values()))

    def load_state_dict(self, state_dict: dict, weights: dict[int, torch.Tensor] | None = None) -> None:
        """torch's loader casts every state tensor to its parameter's dtype; masters and moments of a bf16
        weight stay float32. A state torch's AdamW saved (the run trained with float32 weights until then) holds
        no masters: WEIGHTS, id(parameter) -> its float32 value in the checkpoint's model state, gives them."""
        super().load_state_dict(state_dict)
        for index, p in enumerate(self.params()):
            if self.is_low(p):
                saved = state_dict["state"][index]
                if "master" not in saved:
                    if weights is None:
                        raise ValueError("the optimizer state holds no float32 masters and no weights were given")
                    saved = {**saved, "master": weights[id(p)]}
                for name in ("master", *MOMENTS):
                    self.state[p][name] = saved[name].to(device=p.device, dtype=torch.float32)
                self.state[p]["step"] = saved["step"].detach().clone().cpu()

    def model_state(self, model: torch.nn.Module) -> dict:
        """MODEL's state dict with each bf16 weight's float32 master in its place."""
        masters = {id(p): self.state[p]["master"] for p in self.params() if self.is_low(p)}
        state = model.state_dict(keep_vars=True)
        return {name: masters.get(id(t), t).detach() for name, t in state.items()}


def float32_weights(model: torch.nn.Module, model_state: dict) -> dict[int, torch.Tensor]:
    """id(parameter) -> its value in MODEL_STATE (a checkpoint's model.pt, float32 with either optimizer)."""
    return {id(p): model_state[name] for name, p in model.named_parameters()}


def without_masters(state_dict: dict) -> dict:
    """A MasterAdamW state as torch's AdamW takes it: its masters are the checkpoint's model weights already."""
    state = {index: {k: v for k, v in saved.items() if k != "master"} for index, saved in state_dict["state"].items()}
    return {**state_dict, "state": state}
