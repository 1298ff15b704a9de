"""The live machine as the probe saw it, typed. Field names and order are the doctor's JSON
(schemas/doctor.schema.json): ``Machine.to_json()`` is what ``gptforge doctor --json`` prints under "machine".
"""

from __future__ import annotations

import os
import types
import typing
from dataclasses import asdict, dataclass, fields, is_dataclass

from gptforge.compat.combination import Combination
from gptforge.core.versions import parse_cc


@dataclass(frozen=True)
class Python:
    version: str
    executable: str


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str  # "9.0"
    memory_total_mib: int
    memory_free_mib: int
    uuid: str | None = None  # "GPU-…": names the GPU across CUDA_VISIBLE_DEVICES' renumbering; None in older reports


@dataclass(frozen=True)
class Driver:
    status: str  # "ok", "no-driver" or "error"
    driver_version: str | None
    cuda_version: str | None
    gpus: list[Gpu]
    error: str | None


@dataclass(frozen=True)
class NvccBinary:
    path: str
    real_path: str | None
    version: str | None
    toolkit_root: str | None  # where nvcc itself resolves its toolkit (TOP in --dryrun)
    host_compiler: str | None
    error: str | None


@dataclass(frozen=True)
class Nvcc:
    cuda_home: NvccBinary | None  # bin/nvcc under the CUDA root in effect
    path: NvccBinary | None  # nvcc on PATH
    agree: bool | None
    version: str | None  # the release builds use


@dataclass(frozen=True)
class Libcudart:
    path: str
    real_path: str
    version: str | None
    encoded_version: int | None


@dataclass(frozen=True)
class CudaHome:
    path: str | None
    source: str | None
    exists: bool
    readable: bool
    lib64: str | None  # "dir", "symlink", "broken symlink"
    lib: bool
    cuda_runtime_h: str | None
    headers_only_in_targets: bool
    libcudart: Libcudart | None

    def has(self, relative: str) -> bool:
        """``relative`` (e.g. "bin/nvcc") exists under this root, now."""
        return bool(self.path) and os.path.exists(os.path.join(self.path, relative))


@dataclass(frozen=True)
class Compiler:
    command: str
    source: str
    path: str | None
    kind: str | None  # "gcc", "clang", "other"
    version: str | None
    error: str | None


@dataclass(frozen=True)
class Compilers:
    nvcc_host: Compiler
    cxx: Compiler
    gcc: Compiler
    gxx: Compiler


@dataclass(frozen=True)
class Torch:
    installed: bool
    version: str | None
    cuda: str | None  # torch.version.cuda; None for a CPU build
    arch_list: list[str]
    cudnn: str | None
    nccl: str | None
    cuda_available: bool
    device_count: int
    cuda_warning: str | None
    error: str | None
    cudnn_compiled: str | None = None  # the cuDNN torch was built with; ``cudnn`` is the one it loaded


@dataclass(frozen=True)
class Host:
    """The C and C++ runtimes: glibc, and the newest GLIBCXX of the libstdc++ the process loaded."""
    glibc: str | None
    libstdcxx: str | None  # "3.4.30"
    libstdcxx_path: str | None


@dataclass(frozen=True)
class ApexExtension:
    ok: bool
    error: str | None


@dataclass(frozen=True)
class Package:
    """A Python distribution (DeepSpeed as it is; apex and TransformerEngine say more)."""
    installed: bool
    version: str | None


@dataclass(frozen=True)
class Apex(Package):
    extensions: dict[str, ApexExtension]


@dataclass(frozen=True)
class TransformerEngine(Package):
    packages: dict[str, str]
    import_ok: bool | None
    import_error: str | None
    pip_cudnn_lib: str | None  # site-packages/nvidia/cudnn/lib: torch's own cuDNN, where TE should take it from
    fp8_usable: bool | None  # judged by the doctor from the GPUs present


@dataclass(frozen=True)
class HopperKernels:
    """flash-attn-4 and quack-kernels (accel=hopper) and their CuTe DSL."""
    installed: bool
    packages: dict[str, str]
    dsl_directory: str | None
    dsl_outside_site_packages: bool


@dataclass(frozen=True)
class Machine:
    python: Python
    driver: Driver
    nvcc: Nvcc
    cuda_home: CudaHome
    compilers: Compilers
    torch: Torch
    libcudart_loaded: list[Libcudart]
    apex: Apex
    deepspeed: Package
    transformer_engine: TransformerEngine
    hopper_kernels: HopperKernels
    env: dict[str, str | None]
    host: Host | None = None  # absent from reports saved before it was probed

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Machine":
        """The typed machine from its JSON form (what the probe parts return, or a saved doctor report)."""
        return _typed(cls, data)

    def host_compiler(self) -> Compiler:
        """The compiler nvcc runs, or the C++ compiler when that one is not found."""
        host = self.compilers.nvcc_host
        return host if host.path is not None else self.compilers.cxx

    def combination(self) -> Combination:
        """What the compatibility engine judges: this machine's versions."""
        torch, host = self.torch, self.host_compiler()
        return Combination(
            driver=self.driver.driver_version,
            ccs=tuple(parse_cc(gpu.compute_capability) for gpu in self.driver.gpus),
            cuda=self.nvcc.version,
            torch=torch.version,
            torch_cuda=torch.cuda,
            torch_arch_list=tuple(torch.arch_list) if torch.cuda else None,
            python=".".join(self.python.version.split(".")[:2]),
            gcc=host.version if host.kind == "gcc" else None,
            clang=host.version if host.kind == "clang" else None,
            cudnn=torch.cudnn,
            nccl=torch.nccl,
            apex=self.apex.version or ("unknown" if self.apex.installed else None),
            deepspeed=self.deepspeed.version,
            transformer_engine=self.transformer_engine.version,
            torch_cuda_arch_list_env=self.env["TORCH_CUDA_ARCH_LIST"],
            glibc=self.host.glibc if self.host else None,
            libstdcxx=self.host.libstdcxx if self.host else None,
            torch_cudnn=torch.cudnn_compiled,
        )


def _typed(hint, value):
    """``value`` (JSON data) as ``hint``: a dataclass, ``X | None``, ``list[X]``, ``dict[str, X]`` or a scalar."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # X | None
        return _typed(next(a for a in args if a is not type(None)), value)
    if origin is list:
        return [_typed(args[0], item) for item in value]
    if origin is dict:
        return {key: _typed(args[1], item) for key, item in value.items()}
    if is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _typed(hints[f.name], value.get(f.name)) for f in fields(hint)})
    return value
