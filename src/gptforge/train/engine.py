"""How a step is executed with plain torch (one process or DDP); train/deepspeed_engine.py is the DeepSpeed engine's,
train/fsdp.py FSDP2's. The sharded engines compile each block on its own (compile_blocks), without CUDA graphs.

All expose the same small interface to the loop: ``micro_step`` (forward + backward of one micro
batch), ``step`` (optimizer step at the accumulation boundary, returns the grad norm), ``lr``, and the
checkpoint hooks. Checkpoint directories and the commit protocol belong to train.checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch

from gptforge.core.findings import Finding, Severity
from gptforge.train import checkpoint
from gptforge.train.config import TrainConfig
from gptforge.train.optim import build_scheduler, clipped_step
from gptforge.train.precision import Precision


class TorchEngine:
    def __init__(self, model, raw_model, optimizer, cfg: TrainConfig, precision: Precision, accum: int, ddp: bool,
                 cuda_graphs: bool = False):
        self.model, self.raw_model, self.optimizer = model, raw_model, optimizer
        self.scheduler = build_scheduler(optimizer, cfg)
        self.precision = precision
        self.scaler = precision.make_scaler()
        self.accum, self.ddp = accum, ddp
        self.clip = cfg.clip_grad
        self.cudagraphs = cuda_graphs
        self.kept_grads = own_grad_buffers(raw_model) if cuda_graphs and accum > 1 else None

    def micro_step(self, x, y, is_last: bool) -> torch.Tensor:
        sync = contextlib.nullcontext() if (is_last or not self.ddp) else self.model.no_sync()
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # this micro batch's replay may reuse the last one's outputs
        with sync:
            with self.precision.autocast():
                _, loss = self.model(x, y)
            scaled = loss / self.accum
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return loss.detach()

    def step(self) -> torch.Tensor:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.clip if self.clip > 0 else math.inf
        if self.scaler:
            norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            norm = clipped_step(self.optimizer, list(self.raw_model.parameters()), max_norm)
        self.scheduler.step()
        if self.kept_grads is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            torch._foreach_zero_(self.kept_grads)
        return norm.detach()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def eval_loss(self, x, y) -> torch.Tensor:
        with self.precision.autocast():
            return self.model(x, y)[1].detach()

    def train_mode(self, on: bool) -> None:
        self.model.train(on)

    def state(self) -> tuple[dict, dict, dict]:
        """(model, optimizer, extra trainer state) to save from rank 0."""
        return self.raw_model.state_dict(), self.optimizer.state_dict(), self.schedule_state()

    def schedule_state(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_schedule_state(self, trainer_state: dict) -> None:
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        if self.scaler and trainer_state.get("scaler"):
            self.scaler.load_state_dict(trainer_state["scaler"])

    def save_collective(self, tmp: Path) -> None:
        """Nothing: torch state is gathered on every rank already (DDP replicas)."""

    def load(self, ckpt: Path, trainer_state: dict) -> None:
        self.raw_model.load_state_dict(checkpoint.load_verified(ckpt, "model.pt"))
        self.optimizer.load_state_dict(checkpoint.load_verified(ckpt, "optimizer.pt"))
        self.load_schedule_state(trainer_state)


def own_grad_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """Zeroed .grad buffers for every trainable parameter, kept for the whole run.

    Under CUDA graphs a backward's gradients are memory of the graph, which its next replay overwrites; a
    parameter without a .grad takes that memory as its .grad, so the next micro batch of an accumulation
    would overwrite (or fail on) what the first one left. With buffers of its own each micro batch's
    gradient is added into them (pytorch/pytorch#169545)."""
    grads = []
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
            grads.append(param.grad)
    return grads


def compile_blocks(model: torch.nn.Module, compile_options: dict) -> Finding:
    """Compile each transformer block of MODEL in place, on its own (torchtitan's recipe for sharded engines):
    a block's gradients are ready, and its collectives can start, as soon as its backward ends. Returns the note.

    The block's forward is compiled, not its call: the engines' hooks on the block (FSDP's, ZeRO-3's gathering)
    run around the graph, never traced into it, so the blocks share one graph."""
    for block in model.blocks:
        block.forward = torch.compile(block.forward, **compile_options)
    return Finding("compile-blocks", Severity.INFO, "torch.compile: on, each block on its own (first steps include compilation)")
