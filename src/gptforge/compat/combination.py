"""What a machine or a what-if question is made of. Every field is optional: unknown = None."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Combination:
    """Inputs to ``check``. Versions are strings as users paste them (parsed by the rules).

    driver          NVIDIA driver, "580.65.06"
    ccs             compute capabilities of the GPUs present, ((9, 0),)
    gpu_choices     GPUs named ambiguously, each with the compute capabilities its name may stand for:
                    (("TITAN X", ((5, 2), (6, 1))),); judged as each of them (compat.gpu_choices)
    cuda            the nvcc toolkit that builds extensions, "13.0"
    torch           torch version, may carry the build tag, "2.11.0+cu130"
    torch_cuda      CUDA torch was built with ("13.0"); must agree with a +cuXYZ tag
    torch_arch_list SASS arches the torch build has kernels for, ("sm_90", "sm_100") or ("9.0",)
    python, gcc, clang, cudnn, nccl   versions
    apex, deepspeed, transformer_engine, flash_attn   installed version (or commit) of each, None if absent
    torch_cuda_arch_list_env   the TORCH_CUDA_ARCH_LIST value extension builds will use (None: unset)
    fp8             the run trains in FP8 (TransformerEngine's fp8_autocast)
    recipe          the TransformerEngine FP8 recipe: delayed-scaling, current-scaling,
                    float8-block-scaling, mxfp8 or nvfp4
    glibc           the host's glibc ("2.31", ldd --version)
    libstdcxx       the newest GLIBCXX version the loaded libstdc++ provides ("3.4.30" or "GLIBCXX_3.4.30")
    torch_cudnn     the cuDNN torch was built with ("8.9.2"), against ``cudnn``, the one found at run time
    wheels          prebuilt extension wheels, as file paths or file names
                    ("flash_attn-2.5.5+cu118torch2.2cxx11abiFALSE-cp38-cp38-linux_x86_64.whl"), or
                    installed builds (compat.wheels.installed_builds) as WheelBuild objects
    """

    driver: str | None = None
    ccs: tuple[tuple[int, int], ...] | None = None
    gpu_choices: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] | None = None
    cuda: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    torch_arch_list: tuple[str, ...] | None = None
    python: str | None = None
    gcc: str | None = None
    clang: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    apex: str | None = None
    deepspeed: str | None = None
    transformer_engine: str | None = None
    torch_cuda_arch_list_env: str | None = None
    flash_attn: str | None = None
    fp8: bool = False
    recipe: str | None = None
    wheels: tuple | None = None
    glibc: str | None = None
    libstdcxx: str | None = None
    torch_cudnn: str | None = None
