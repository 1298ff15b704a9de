"""Process group setup on existing launchers only: torchrun / torch.distributed.run, the deepspeed
launcher, or srun running torchrun. They all export RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str = ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def launched(self) -> bool:
        return bool(self.backend)


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_by_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from gptforge.errors import UsageError

        raise UsageError("--device", "cuda asked for but torch sees no GPU", "use --device cpu or check 'gptforge doctor'")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init(requested_device: str, use_deepspeed: bool, group: bool = False) -> tuple[DistEnv, torch.device]:
    """The process group the launcher describes; GROUP: one of a single process where no launcher started
    this one (FSDP shards over a group, of one process too)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(requested_device, local_rank)
    if not launched_by_launcher() and not use_deepspeed and not group:
        return DistEnv(), device
    backend = "nccl" if device.type == "cuda" else "gloo"
    if use_deepspeed:
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend)
    elif not dist.is_initialized():
        alone = {} if launched_by_launcher() else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None, **alone)
    return DistEnv(dist.get_rank(), local_rank, dist.get_world_size(), backend), device


def barrier(env: DistEnv) -> None:
    if env.launched:
        dist.barrier()


def mean_across(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.launched and env.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return value


def shutdown(env: DistEnv) -> None:
    if env.launched and dist.is_initialized():
        dist.destroy_process_group()
