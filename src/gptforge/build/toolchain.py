"""The build toolchain a preflight judges: read from the live machine (through gptforge.probe), every
field overridable so a build host can be checked against another torch than the one installed."""

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
    driver: str | None = None
    python_tag: str = field(default_factory=lambda: python_abi_tag())

    def with_overrides(self, **changes) -> "Toolchain":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def cuda_home_has(self, relative: str) -> bool:
        return bool(self.cuda_home) and (Path(self.cuda_home) / relative).exists()


def python_abi_tag() -> str:
    """e.g. ``cp312-cp312-linux_x86_64``: the tags a compiled wheel for this interpreter carries."""
    from packaging import tags

    tag = next(tags.sys_tags())
    return f"{tag.interpreter}-{tag.abi}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


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
        nvcc_toolkit_root=(used or {}).get("toolkit_root"), cuda_home=home, cuda_home_source=source,
        gcc_version=host["version"], gcc_kind=host["kind"],
        ccs=tuple(g["compute_capability"] for g in nvml["gpus"]), driver=nvml["driver_version"],
    )
