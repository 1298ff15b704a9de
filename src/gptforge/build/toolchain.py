"""The build toolchain a preflight judges: read from the live machine (through gptforge.probe); torch's
CUDA can be replaced (``as_if_torch_cuda``) to check a build host against a torch not installed yet."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Toolchain:
    torch_version: str | None
    torch_cuda: str | None  # torch.version.cuda; None for a CPU build
    nvcc_version: str | None  # "13.0"
    nvcc_toolkit_root: str | None  # where nvcc itself resolves its toolkit (fix for a wrong CUDA_HOME)
    cuda_home: str | None
    cuda_home_source: str | None
    gcc_version: str | None  # the host compiler nvcc uses
    gcc_kind: str | None
    ccs: tuple[str, ...] = ()  # compute capabilities of the GPUs present
    torch_arch_list: tuple[str, ...] = ()  # torch.cuda.get_arch_list()
    driver: str | None = None
    python_tag: str = field(default_factory=lambda: python_abi_tag())

    def as_if_torch_cuda(self, cuda: str | None) -> "Toolchain":
        """What-if: this torch version built for CUDA ``cuda`` (its local tag, e.g. +cpu, dropped)."""
        if not cuda:
            return self
        version = self.torch_version.split("+")[0] if self.torch_version else None
        return replace(self, torch_cuda=cuda, torch_version=version, torch_arch_list=())

    def cuda_home_has(self, relative: str) -> bool:
        return bool(self.cuda_home) and (Path(self.cuda_home) / relative).exists()


def python_abi_tag() -> str:
    """e.g. ``cp312-cp312-linux_x86_64``: the tags a compiled wheel for this interpreter carries."""
    from packaging import tags

    tag = next(tags.sys_tags())
    return f"{tag.interpreter}-{tag.abi}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def complete_toolkit_root(nvcc: dict) -> str | None:
    """A CUDA root with bin/nvcc and include/cuda_runtime.h, as the nvcc binaries found resolve it."""
    candidates = []
    for found in (nvcc["cuda_home"], nvcc["path"]):
        if found:
            candidates.append(found.get("toolkit_root"))
            if found.get("real_path"):
                candidates.append(os.path.dirname(os.path.dirname(found["real_path"])))
    for root in filter(None, candidates):
        if os.path.isfile(os.path.join(root, "bin", "nvcc")) and os.path.isfile(os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None


def probe_toolchain(env: dict | None = None) -> Toolchain:
    """The live machine, read once, through gptforge.probe."""
    from gptforge.probe.compilers import probe_compilers
    from gptforge.probe.nvcc import cuda_home_setting, probe_nvcc
    from gptforge.probe.nvml import probe_nvml
    from gptforge.probe.torch_info import probe_torch

    env = dict(os.environ if env is None else env)
    nvcc = probe_nvcc(env)
    used = nvcc["cuda_home"] if (nvcc["cuda_home"] or {}).get("version") else nvcc["path"]
    host = probe_compilers((used or {}).get("host_compiler"), env)["nvcc_host"]
    torch = probe_torch()
    nvml = probe_nvml()
    home, source = cuda_home_setting(env)
    return Toolchain(
        torch_version=torch["version"], torch_cuda=torch["cuda"], nvcc_version=nvcc["version"],
        nvcc_toolkit_root=complete_toolkit_root(nvcc), cuda_home=home, cuda_home_source=source,
        gcc_version=host["version"], gcc_kind=host["kind"],
        ccs=tuple(g["compute_capability"] for g in nvml["gpus"]), torch_arch_list=tuple(torch["arch_list"]),
        driver=nvml["driver_version"],
    )
