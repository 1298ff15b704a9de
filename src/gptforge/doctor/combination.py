"""The compatibility engine's view of the live machine: a Combination built from the probe."""

from __future__ import annotations

from gptforge.compat.combination import Combination
from gptforge.core.versions import parse_cc
from gptforge.compat.wheels import installed_builds


def combination_from_machine(machine: dict) -> Combination:
    torch, host = machine["torch"], machine["compilers"]["nvcc_host"]
    if host["path"] is None:
        host = machine["compilers"]["cxx"]
    return Combination(
        driver=machine["driver"]["driver_version"],
        ccs=tuple(parse_cc(gpu["compute_capability"]) for gpu in machine["driver"]["gpus"]),
        cuda=machine["nvcc"]["version"],
        torch=torch["version"],
        torch_cuda=torch["cuda"],
        torch_arch_list=tuple(torch["arch_list"]) if torch["cuda"] else None,
        python=".".join(machine["python"]["version"].split(".")[:2]),
        gcc=host["version"] if host["kind"] == "gcc" else None,
        clang=host["version"] if host["kind"] == "clang" else None,
        cudnn=torch["cudnn"],
        nccl=torch["nccl"],
        apex=machine["apex"]["version"] or ("unknown" if machine["apex"]["installed"] else None),
        deepspeed=machine["deepspeed"]["version"],
        transformer_engine=machine["transformer_engine"]["version"],
        torch_cuda_arch_list_env=machine["env"]["TORCH_CUDA_ARCH_LIST"],
        wheels=installed_builds() or None,  # the installed extension builds, from their metadata
    )
