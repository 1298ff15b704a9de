"""Checks run before a minutes-long compile: each problem is a Finding with its fix.

The version rules (nvcc vs torch, host compiler range, arch lists, DeepSpeed's minor-version table,
TransformerEngine FP8) live in the compat engine; this module asks it about the probed machine and adds
what only a build needs to see (CUDA_HOME's contents, apex's exact-match rule, lib64 for DeepSpeed).
"""

from __future__ import annotations

from dataclasses import replace

from gptforge import compat
from gptforge.build.source import apex_pin
from gptforge.build.toolchain import complete_toolkit_root
from gptforge.compat.findings import Finding, Severity, unique
from gptforge.compat.extension_rules import te_import_failure
from gptforge.probe.machine import Machine

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def combination(machine: Machine, *, apex: str | None = None, deepspeed: str | None = None,
                transformer_engine: str | None = None) -> compat.Combination:
    """The machine as a build is judged: the package being built in place of those installed; Python, cuDNN,
    NCCL and the TORCH_CUDA_ARCH_LIST setting left out (a build sets its own arch list); an empty arch list
    (a what-if torch, or CUDA not usable here) and no GPU read as unknown."""
    combo = machine.combination()
    return replace(combo, python=None, cudnn=None, nccl=None, torch_cuda_arch_list_env=None,
                   ccs=combo.ccs or None, torch_arch_list=combo.torch_arch_list or None,
                   apex=apex, deepspeed=deepspeed, transformer_engine=transformer_engine)


def _engine(machine: Machine, **pkg) -> list[Finding]:
    return list(compat.check(combination(machine, **pkg)))


def toolchain_findings(machine: Machine) -> list[Finding]:
    """What every CUDA extension build needs: torch with CUDA, nvcc, a complete CUDA_HOME."""
    torch, home, out = machine.torch, machine.cuda_home, []
    if torch.version is None:
        out.append(Finding("torch-missing", ERROR, "torch is not installed in this environment",
                           "install torch first (the build compiles against it), then re-run"))
    elif torch.cuda is None:
        out.append(Finding("torch-no-cuda", ERROR,
                           f"torch has no CUDA: torch {torch.version} is a CPU build, so CUDA extensions cannot be built against it",
                           "install a CUDA build of torch, e.g. pip install torch==<ver> --index-url "
                           "https://download.pytorch.org/whl/cu130 (the cuXYZ matching your nvcc)"))
    if machine.nvcc.version is None:
        out.append(Finding("nvcc-missing", ERROR, "nvcc was not found (no CUDA_HOME/CUDA_PATH, none on PATH)",
                           "install the CUDA toolkit (a 'devel' image) and set CUDA_HOME to its root"))
        return out
    missing = [rel for rel in ("bin/nvcc", "include/cuda_runtime.h") if not home.has(rel)]
    if missing:
        root = complete_toolkit_root(machine.nvcc)
        fix = f"export CUDA_HOME={root}" if root and root != home.path else "set CUDA_HOME to a full CUDA toolkit root"
        out.append(Finding("cuda-home-incomplete", ERROR,
                           f"CUDA_HOME={home.path} (from {home.source}) has no {' and no '.join(missing)}; "
                           "torch's extension builder would compile against it", fix))
    return out


def _buildable(machine: Machine) -> bool:
    return bool(machine.torch.cuda and machine.nvcc.version)


def apex_findings(machine: Machine, apex_ref: str | None = None) -> list[Finding]:
    """Everything that would make apex's setup.py fail, before it starts (apex's exact nvcc == torch CUDA
    rule is the engine's ``apex-nvcc-mismatch``; a major difference is also ``nvcc-torch-mismatch``)."""
    out = toolchain_findings(machine)
    if _buildable(machine):
        out += _engine(machine, apex=apex_ref or apex_pin()["commit"])
    return unique(out)


def deepspeed_findings(machine: Machine, deepspeed_version: str | None) -> list[Finding]:
    out = toolchain_findings(machine)
    if _buildable(machine):
        out += _engine(machine, deepspeed=deepspeed_version)
    home = machine.cuda_home
    if home.path and home.has("bin/nvcc") and not home.has("lib64"):
        out.append(Finding("cuda-home-no-lib64", ERROR,
                           f"CUDA_HOME={home.path} has no lib64/: DeepSpeed links -L$CUDA_HOME/lib64 (async_io, gds; "
                           "older op builders for every op) and fails with 'cannot find -lcudart'",
                           "run `gptforge fix-links` (links lib64 -> lib), then re-run"))
    return unique(out)


def transformer_engine_findings(machine: Machine) -> list[Finding]:
    """Is TransformerEngine installed, does it import, can it run FP8 on the GPUs present?"""
    te = machine.transformer_engine
    if not te.installed:
        return [Finding("te-not-installed", INFO, "TransformerEngine is not installed (optional: FP8 layers)",
                        "pip install --no-build-isolation 'transformer_engine[pytorch]' to use FP8 on sm_89+")]
    if not te.import_ok:
        return [te_import_failure(te.version, te.import_error, te.pip_cudnn_lib, machine.torch.cudnn)]
    found = [Finding("te-ok", INFO, f"TransformerEngine {te.version} imports")]
    ccs = [gpu.compute_capability for gpu in machine.driver.gpus]
    if ccs and machine.torch.cuda:
        fp8 = [f for f in _engine(machine, transformer_engine=te.version) if f.code.startswith("fp8")]
        found += fp8 or [Finding("te-fp8-ready", INFO, f"FP8 can run on the GPUs present (CC {', '.join(ccs)})")]
    return found
