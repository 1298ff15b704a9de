"""Checks run before a minutes-long compile: each problem is a Finding with its fix.

The version rules (nvcc vs torch, host compiler range, arch lists, DeepSpeed's minor-version table,
TransformerEngine FP8) live in the compat engine; this module asks it about the toolchain and adds what
only a build needs to see (CUDA_HOME's contents, apex's exact-match rule, lib64 for DeepSpeed).
"""

from __future__ import annotations

from gptforge import compat
from gptforge.build.pins import apex_pin
from gptforge.build.toolchain import Toolchain
from gptforge.compat.findings import Finding, Severity
from gptforge.core.versions import parse_cc

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def combination(tc: Toolchain, *, apex: str | None = None, deepspeed: str | None = None,
                transformer_engine: str | None = None):
    ccs = tuple(parse_cc(cc) for cc in tc.ccs) or None
    return compat.Combination(driver=tc.driver, ccs=ccs, cuda=tc.nvcc_version, torch=tc.torch_version,
                              torch_cuda=tc.torch_cuda, gcc=tc.gcc_version if tc.gcc_kind == "gcc" else None,
                              clang=tc.gcc_version if tc.gcc_kind == "clang" else None, apex=apex, deepspeed=deepspeed,
                              transformer_engine=transformer_engine, torch_arch_list=tc.torch_arch_list or None)


def _engine(tc: Toolchain, **pkg) -> list[Finding]:
    return list(compat.check(combination(tc, **pkg)))


def toolchain_findings(tc: Toolchain) -> list[Finding]:
    """What every CUDA extension build needs: torch with CUDA, nvcc, a complete CUDA_HOME."""
    out: list[Finding] = []
    if tc.torch_version is None:
        out.append(Finding("torch-missing", ERROR, "torch is not installed in this environment",
                           "install torch first (the build compiles against it), then re-run"))
    elif tc.torch_cuda is None:
        out.append(Finding("torch-no-cuda", ERROR,
                           f"torch has no CUDA: torch {tc.torch_version} is a CPU build, so CUDA extensions cannot be built against it",
                           "install a CUDA build of torch, e.g. pip install torch==<ver> --index-url "
                           "https://download.pytorch.org/whl/cu130 (the cuXYZ matching your nvcc)"))
    if tc.nvcc_version is None:
        out.append(Finding("nvcc-missing", ERROR, "nvcc was not found (no CUDA_HOME/CUDA_PATH, none on PATH)",
                           "install the CUDA toolkit (a 'devel' image) and set CUDA_HOME to its root"))
        return out
    missing = [rel for rel in ("bin/nvcc", "include/cuda_runtime.h") if not tc.cuda_home_has(rel)]
    if missing:
        root = tc.nvcc_toolkit_root
        fix = f"export CUDA_HOME={root}" if root and root != tc.cuda_home else "set CUDA_HOME to a full CUDA toolkit root"
        out.append(Finding("cuda-home-incomplete", ERROR,
                           f"CUDA_HOME={tc.cuda_home} (from {tc.cuda_home_source}) has no {' and no '.join(missing)}; "
                           "torch's extension builder would compile against it", fix))
    return out


def apex_findings(tc: Toolchain, apex_ref: str | None = None) -> list[Finding]:
    """Everything that would make apex's setup.py fail, before it starts (apex's exact nvcc == torch CUDA
    rule is the engine's ``apex-nvcc-mismatch``; a major difference is also ``nvcc-torch-mismatch``)."""
    out = toolchain_findings(tc)
    if tc.torch_cuda and tc.nvcc_version:
        out += _engine(tc, apex=apex_ref or apex_pin()["commit"])
    return _dedupe(out)


def deepspeed_findings(tc: Toolchain, deepspeed_version: str | None) -> list[Finding]:
    out = toolchain_findings(tc)
    if tc.torch_cuda and tc.nvcc_version:
        out += _engine(tc, deepspeed=deepspeed_version)
    if tc.cuda_home and tc.cuda_home_has("bin/nvcc") and not tc.cuda_home_has("lib64"):
        out.append(Finding("cuda-home-no-lib64", ERROR,
                           f"CUDA_HOME={tc.cuda_home} has no lib64/: DeepSpeed links -L$CUDA_HOME/lib64 (async_io, gds; "
                           "older op builders for every op) and fails with 'cannot find -lcudart'",
                           "run `gptforge fix-links` (links lib64 -> lib), then re-run"))
    return _dedupe(out)


def transformer_engine_findings(tc: Toolchain) -> list[Finding]:
    """Is TransformerEngine installed, does it import, can it run FP8 on the GPUs present?"""
    from gptforge.probe.packages import probe_transformer_engine

    te = probe_transformer_engine()
    if not te["installed"]:
        return [Finding("te-not-installed", INFO, "TransformerEngine is not installed (optional: FP8 layers)",
                        "pip install --no-build-isolation 'transformer_engine[pytorch]' to use FP8 on sm_89+")]
    if not te["import_ok"]:
        return [Finding("te-import-failed", ERROR, f"TransformerEngine {te['version']} does not import: {te['import_error']}",
                        "reinstall it against this torch: pip install --no-build-isolation --force-reinstall 'transformer_engine[pytorch]'")]
    found = [Finding("te-ok", INFO, f"TransformerEngine {te['version']} imports")]
    if tc.ccs and tc.torch_cuda:
        fp8 = [f for f in _engine(tc, transformer_engine=te["version"]) if f.code.startswith("fp8")]
        found += fp8 or [Finding("te-fp8-ready", INFO, f"FP8 can run on the GPUs present (CC {', '.join(tc.ccs)})")]
    return found


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if f.code not in seen:
            seen.add(f.code)
            out.append(f)
    return out
