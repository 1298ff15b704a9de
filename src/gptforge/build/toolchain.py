"""What a build plan needs from the probed machine, and the what-if a build host can be judged under: torch's
CUDA replaced (``as_if_torch_cuda``) to check it against a torch not installed yet."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field, replace

from gptforge.probe.machine import Machine, Nvcc


@dataclass(frozen=True)
class Toolchain:
    torch_version: str | None
    torch_cuda: str | None  # torch.version.cuda; None for a CPU build
    nvcc_version: str | None  # "13.0"
    cuda_home: str | None
    ccs: tuple[str, ...] = ()  # compute capabilities of the GPUs present
    python_tag: str = field(default_factory=lambda: python_abi_tag())

    @classmethod
    def of(cls, machine: Machine) -> "Toolchain":
        return cls(torch_version=machine.torch.version, torch_cuda=machine.torch.cuda,
                   nvcc_version=machine.nvcc.version, cuda_home=machine.cuda_home.path,
                   ccs=tuple(gpu.compute_capability for gpu in machine.driver.gpus))


def as_if_torch_cuda(machine: Machine, cuda: str | None) -> Machine:
    """What-if: this torch version built for CUDA ``cuda`` (its local tag, e.g. +cpu, and its arch list dropped)."""
    if not cuda:
        return machine
    version = machine.torch.version.split("+")[0] if machine.torch.version else None
    return replace(machine, torch=replace(machine.torch, cuda=cuda, version=version, arch_list=[]))


def python_abi_tag() -> str:
    """e.g. ``cp312-cp312-linux_x86_64``: the tags a compiled wheel for this interpreter carries."""
    from packaging import tags

    tag = next(tags.sys_tags())
    return f"{tag.interpreter}-{tag.abi}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def complete_toolkit_root(nvcc: Nvcc) -> str | None:
    """A CUDA root with bin/nvcc and include/cuda_runtime.h, as the nvcc binaries found resolve it."""
    candidates = []
    for found in (nvcc.cuda_home, nvcc.path):
        if found:
            candidates.append(found.toolkit_root)
            if found.real_path:
                candidates.append(os.path.dirname(os.path.dirname(found.real_path)))
    for root in filter(None, candidates):
        if os.path.isfile(os.path.join(root, "bin", "nvcc")) and os.path.isfile(os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None
