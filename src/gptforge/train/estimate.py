"""Before training: how long will this run take on this device, and is it hopeless here?

The device's matmul throughput is measured (a fraction of a second) at the width of the model, and
the run's FLOPs (PaLM's 6N + attention per token, evaluations included) are divided by it. Matmuls
are the fastest part of a step, so the figure is a lower bound: a run it calls hopeless is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gptforge.train.config import TrainConfig, load_config, packaged_configs

HOPELESS_SECONDS = 24 * 3600  # a first run that needs more than a day on this device is the wrong config for it
MEASURE_SECONDS = 0.3


@dataclass(frozen=True)
class Estimate:
    config_name: str
    device: str
    flops_per_second: float  # measured matmul throughput
    step_seconds: float  # at least, per optimizer step (all data-parallel ranks together)
    run_seconds: float  # at least, for the steps left and their evaluations
    fits: str | None  # the largest packaged config whose whole run is not hopeless here (looked up for a hopeless run)

    @property
    def hopeless(self) -> bool:
        return self.run_seconds > HOPELESS_SECONDS

    def describe(self) -> str:
        line = (f"estimate on {self.device}: at least {duration(self.step_seconds)} per step, "
                f"{duration(self.run_seconds)} for the run ({self.flops_per_second / 1e9:,.0f} GFLOP/s measured)")
        if not self.hopeless:
            return line
        fix = f"use --config {self.fits}" if self.fits else "no packaged config fits in a day here"
        return f"{line}\n  {self.config_name} is hopeless on {self.device}: {fix}, or train on a GPU"


def duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.2f} s"


def matmul_flops_per_second(device: torch.device, dtype: torch.dtype, width: int, rows: int) -> float:
    """FLOP/s of (rows x width) @ (width x 4 width), the MLP's matmul, timed for about MEASURE_SECONDS."""
    rows = max(64, min(rows, 4096))
    a = torch.full((rows, width), 0.5, device=device, dtype=dtype)  # not randn: the run's RNG stream stays untouched
    b = torch.full((width, 4 * width), 0.25, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm up (kernel choice, allocation)
    _sync(device)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < MEASURE_SECONDS or count < 3:
        torch.matmul(a, b)
        count += 1
        if count % 8 == 0:
            _sync(device)
    _sync(device)
    elapsed = time.perf_counter() - start
    return 2 * rows * width * 4 * width * count / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flops_per_token(cfg: TrainConfig, vocab_size: int) -> float:
    """PaLM appendix B: 6N + 12·L·H·Q·T, from a model built on the meta device (no memory)."""
    from gptforge.model.gpt import GPT

    with torch.device("meta"):
        model = GPT(cfg.model_config(vocab_size))
    return model.flops_per_token(cfg.seq_length)


def run_flops(cfg: TrainConfig, vocab_size: int, steps: int) -> tuple[float, float]:
    """(FLOPs of one optimizer step, FLOPs of ``steps`` steps with their evaluations)."""
    per_token = flops_per_token(cfg, vocab_size)
    step = per_token * cfg.global_batch_size * cfg.seq_length
    evals = steps // cfg.eval_interval + 1
    eval_flops = evals * cfg.eval_iters * step / 3  # forward only: a third of a training step
    return step, step * steps + eval_flops


def estimate(cfg: TrainConfig, vocab_size: int, device: torch.device, *, world_size: int = 1, steps_left: int | None = None,
             config_name: str = "this config") -> Estimate:
    dtype = torch.float32 if device.type == "cpu" else (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    measured = matmul_flops_per_second(device, dtype, cfg.hidden_size, cfg.micro_batch_size * cfg.seq_length)
    speed = measured * world_size
    step, total = run_flops(cfg, vocab_size, cfg.train_iters if steps_left is None else steps_left)
    # every packaged config's model is built to count its FLOPs: only a hopeless run names one
    fits = _largest_that_fits(speed, vocab_size) if total / speed > HOPELESS_SECONDS else None
    return Estimate(config_name, device.type, measured, step / speed, total / speed, fits)


def _largest_that_fits(speed: float, vocab_size: int) -> str | None:
    """The packaged config with the most FLOPs per step whose full run takes at most HOPELESS_SECONDS at ``speed``."""
    fitting = []
    for name in packaged_configs():
        cfg, _ = load_config(name)
        step, total = run_flops(cfg, vocab_size, cfg.train_iters)
        if total / speed <= HOPELESS_SECONDS:
            fitting.append((step, name))
    return max(fitting)[1] if fitting else None
