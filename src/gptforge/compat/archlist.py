"""What nvcc can target, and the TORCH_CUDA_ARCH_LIST to build for the GPUs present."""

from __future__ import annotations

from collections.abc import Iterable

from gptforge.compat.arches import CC, Arch, best_cubin
from gptforge.compat.facts import facts
from gptforge.core.versions import CudaVersion, VersionError, format_cc, parse_cuda
from gptforge.errors import GptforgeError


def _cuda(cuda: str | CudaVersion) -> CudaVersion:
    if isinstance(cuda, CudaVersion):
        return cuda
    try:
        return parse_cuda(cuda)
    except VersionError as err:
        raise GptforgeError(str(err)) from None


def _targetable(cuda: str | CudaVersion) -> tuple[CudaVersion, tuple[Arch, ...]]:
    version = _cuda(cuda)
    arches = facts().targetable(version)
    if arches is None:
        raise GptforgeError(f"CUDA {version.release} is not in gptforge's arch table",
                            "add it to compat/data/cuda_arches.toml (docs/compat.md)")
    return version, arches


def targetable_arches(cuda: str | CudaVersion) -> list[str]:
    """Every arch nvcc of this CUDA can generate code for, oldest first: ['7.5', ..., '9.0', '9.0a', ...]."""
    return [str(a) for a in sorted(_targetable(cuda)[1])]


def arch_list_for(ccs: Iterable[CC], cuda: str | CudaVersion, *, allow_suffix: bool = True) -> str:
    """TORCH_CUDA_ARCH_LIST for the GPUs present, restricted to what this nvcc can target.

    Each GPU gets its exact arch; with ``allow_suffix`` its arch-specific variant ("9.0a") when
    nvcc has one (that cubin runs only on that CC, which is the GPU present). A GPU whose exact
    arch nvcc lacks gets the highest lower arch of the same major (binary compatible). GPUs that
    nothing fits are left out; when none is left, GptforgeError. ``allow_suffix=False`` gives
    plain "9.0" (DeepSpeed's op builder cannot parse suffixes).
    """
    version, arches = _targetable(cuda)
    wanted = sorted(set(ccs))
    if not wanted:
        raise GptforgeError("no GPU to build for", "give the compute capabilities of the GPUs present")
    chosen = {best_cubin(list(arches), cc, allow_suffix=allow_suffix) for cc in wanted}
    chosen.discard(None)
    if not chosen:
        gpus = ", ".join(format_cc(cc) for cc in wanted)
        raise GptforgeError(f"nvcc {version.release} can target none of the GPUs present (CC {gpus})",
                            "use a CUDA toolkit that supports them (gptforge compat recommend)")
    return ";".join(str(a) for a in sorted(chosen))
