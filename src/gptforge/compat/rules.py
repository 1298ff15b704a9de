"""The rules: each reads a parsed Combination and yields Findings with stable codes.

Facts come from compat/data/ through ``facts()``; nothing here hard-codes a version table.
A rule skips what it does not know. ``check`` runs them all and returns the findings sorted
(errors first), so the result does not depend on the order of the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from packaging.version import Version

from gptforge.compat import host_rules, nccl_rules, project_envs
from gptforge.compat.arch_rules import (rule_arch_list_env, rule_arch_suffix_crash, rule_cpp_extension_arches,
                                        rule_nvcc_arch, rule_nvrtc_arch, rule_torch_arch)
from gptforge.compat.arches import CC, Arch, ptx_runs_on, runs_on
from gptforge.compat.combination import Combination
from gptforge.compat.context import Context, build_context
from gptforge.compat.extension_rules import (rule_apex_contrib, rule_deepspeed, rule_flash_attn, rule_fp8,
                                             rule_te_flash_attn, rule_te_recipe, rule_transformer_engine)
from gptforge.compat.facts import facts, load_table, release_row
from gptforge.compat.findings import Finding, Severity, in_order, unique
from gptforge.compat.gpu_choices import judge_each_choice
from gptforge.compat.rule_helpers import at_least, env_hint, join_fixes
from gptforge.core.versions import CudaVersion, DriverVersion, format_cc
from gptforge.compat.wheel_rules import rule_flash_attn_source_build, rule_flash_attn_wheel_build, rule_wheels

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


# --- versions the tables do not know ---------------------------------------------------------


def rule_known_versions(ctx: Context, suggest: bool) -> Iterator[Finding]:
    for who, cuda in ctx.cuda_versions():
        key = (cuda.major, cuda.minor)
        if key in ctx.facts.missing_cuda:
            yield Finding("cuda-unknown", W, f"{who}: {ctx.facts.missing_cuda[key]}",
                          "check the version: nvcc --version / torch.version.cuda")
        elif key not in ctx.facts.cuda:
            yield Finding("cuda-unknown", W, f"{who} is not in gptforge's tables; rules that need it were skipped",
                          "add the release to compat/data (docs/compat.md: adding a CUDA release)")
    if ctx.torch and ctx.torch_release is None:
        yield Finding("torch-unknown", W, f"torch {ctx.torch.release} is not in gptforge's tables; "
                      "torch rules were skipped", "add the release to compat/data/torch.toml")
    elif ctx.torch_release and ctx.torch_cuda and ctx.torch_variant is None and _never_published(ctx):
        tags = sorted({v.cuda.tag for v in ctx.torch_release.variants if v.channel == "pypi"})
        yield Finding("torch-build-unpublished", E,
                      f"torch {ctx.torch} was never published: the CUDA builds of torch {ctx.torch.version.public} "
                      f"are {', '.join(tags)}", "install one of them: " + " or ".join(
                          f"torch=={ctx.torch.version.public}+{tag}" for tag in tags))
    elif ctx.torch_release and ctx.torch_cuda and ctx.torch_variant is None:
        have = ", ".join(sorted({v.cuda.tag for v in ctx.torch_release.variants}))
        yield Finding("torch-cuda-variant-unknown", W,
                      f"no published torch {ctx.torch_release.release} build for CUDA {ctx.torch_cuda} (known: {have})",
                      f"install one of the published builds ({have})")


def _never_published(ctx: Context) -> bool:
    """A +cuXYZ build of a released torch version whose release lists every CUDA build it has."""
    version = ctx.torch.version
    return (ctx.torch.cuda is not None and ctx.torch_release.wheels_complete and not version.is_prerelease
            and not version.is_postrelease and ctx.facts.python_tags(version) is not None)


# --- driver ---------------------------------------------------------------------------------


def rule_driver(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.driver is None:
        return
    for who, cuda in ctx.cuda_versions():
        floor = ctx.facts.runtime_floor(cuda)
        toolkit = ctx.facts.toolkit_driver(cuda)
        if floor and ctx.driver < floor:
            compat = ctx.facts.minor_compat.get(cuda.major)
            why = (f"CUDA {cuda.major}.x needs driver >= {floor}" if compat
                   else f"CUDA {cuda.release} needs driver >= {floor} (no minor-version compatibility)")
            yield Finding("driver-too-old", E, f"driver {ctx.driver} is too old for {who}: {why}",
                          join_fixes(env_hint(ctx, suggest), f"upgrade the NVIDIA driver to >= {floor}"))
        elif toolkit and ctx.driver < toolkit and (jit := _needs_ptx_jit(ctx, cuda)):
            yield Finding("ptx-newer-than-driver", E,
                          f"driver {ctx.driver} runs {who} only through minor-version compatibility (the toolkit's "
                          f"own driver is {toolkit}), and a CUDA program nvcc builds with its default arch "
                          f"({jit[0].sm}) reaches CC {format_cc(jit[1])} only through PTX, which this driver cannot "
                          "JIT-compile: 'the provided PTX was compiled with an unsupported toolchain' "
                          "(cudaErrorUnsupportedPtxVersion)",
                          f"upgrade the driver to >= {toolkit}, or build SASS for the GPU "
                          f"(-arch=sm_{jit[1][0]}{jit[1][1]}, CMAKE_CUDA_ARCHITECTURES={jit[1][0]}{jit[1][1]})")
        elif toolkit and ctx.driver < toolkit and ctx.nvcc and cuda.release == ctx.nvcc.release \
                and (carrier := _extension_ptx(ctx)):
            yield Finding("ptx-newer-than-driver", E,
                          f"driver {ctx.driver} runs nvcc {ctx.nvcc}'s code only through minor-version compatibility "
                          f"(the toolkit's own driver is {toolkit}): {carrier} this driver cannot JIT-compile nvcc's "
                          "PTX: 'CUDA error: the provided PTX was compiled with an unsupported toolchain' at "
                          "the first CUDA call",
                          f"upgrade the driver to >= {toolkit}; or rebuild the extensions with the GPU's own arch in "
                          "TORCH_CUDA_ARCH_LIST")
        elif toolkit and ctx.driver < toolkit:
            yield Finding(
                "ptx-newer-than-driver", W,
                f"driver {ctx.driver} runs {who} only through minor-version compatibility (the toolkit's own "
                f"driver is {toolkit}): PTX from this toolkit cannot be JIT-compiled "
                "('the provided PTX was compiled with an unsupported toolchain')",
                f"build SASS for every GPU (TORCH_CUDA_ARCH_LIST without +PTX), or upgrade the driver to >= {toolkit}")


def _needs_ptx_jit(ctx: Context, cuda: CudaVersion) -> tuple[Arch, CC] | None:
    """A plain CUDA program (no torch: nothing sets its arches) built by this nvcc with its default arch, and
    the first GPU that SASS does not run on: that GPU needs the PTX JIT-compiled."""
    if ctx.torch is not None or ctx.nvcc is None or cuda.release != ctx.nvcc.release or ctx.arch_env is not None:
        return None
    default = ctx.facts.nvcc_default_arch.get((cuda.major, cuda.minor))
    missed = [cc for cc in ctx.ccs if default and not runs_on(default, cc)]
    return (default, missed[0]) if missed else None


def _extension_ptx(ctx: Context) -> str | None:
    """The extensions nvcc builds reach a GPU only through nvcc's PTX: TORCH_CUDA_ARCH_LIST has no cubin that runs on
    it, only PTX (the driver loads a module's PTX only where no cubin fits: cupy/cupy#6875)."""
    if ctx.torch is None or ctx.torch_is_cpu or not ctx.arch_env:
        return None
    sass, ptx = ctx.arch_env
    for cc in ctx.ccs:
        if not any(runs_on(a, cc) for a in sass) and any(ptx_runs_on(a, cc) for a in ptx):
            return (f"the extensions built with TORCH_CUDA_ARCH_LIST={ctx.combo.torch_cuda_arch_list_env} reach "
                    f"CC {format_cc(cc)} only through PTX, and")
    return None


def rule_gpu_newer_than_driver(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.driver is None:
        return
    for cc in ctx.ccs:
        first = ctx.facts.first_cuda_for(cc)
        needed = ctx.facts.toolkit_driver(first) if first else None
        if needed and ctx.driver < needed:
            yield Finding("gpu-newer-than-driver", E,
                          f"a CC {format_cc(cc)} GPU needs a driver from CUDA {first}'s generation (>= {needed}); "
                          f"driver {ctx.driver} predates it",
                          f"upgrade the NVIDIA driver to >= {needed}")


# --- toolkit against torch and host compilers ------------------------------------------------


def rule_nvcc_torch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    nvcc, torch_cuda = ctx.nvcc, ctx.torch_cuda
    if nvcc and not torch_cuda and not ctx.torch_is_cpu:
        yield from _nvcc_vs_every_build(ctx)
    if not nvcc or not torch_cuda or ctx.torch_is_cpu:
        return
    fix = f"use nvcc {torch_cuda.release} (conda-forge cuda-nvcc={torch_cuda.release}) with this torch"
    if nvcc.major != torch_cuda.major:
        yield Finding("nvcc-torch-mismatch", E,
                      f"nvcc {nvcc} and torch's CUDA {torch_cuda} differ in major version: torch refuses to build "
                      "extensions ('The detected CUDA version mismatches the version that was used to compile PyTorch')",
                      fix)
    elif nvcc.minor != torch_cuda.minor:
        yield Finding("nvcc-torch-mismatch", W,
                      f"nvcc {nvcc.release} and torch's CUDA {torch_cuda.release} differ in minor version "
                      "(torch only warns)", fix)
    if ctx.combo.apex is not None and nvcc.release != torch_cuda.release:
        yield Finding("apex-nvcc-mismatch", E,
                      f"apex refuses nvcc {nvcc.release} with torch built for CUDA {torch_cuda.release}: any major.minor "
                      "difference stops its build ('Cuda extensions are being compiled with a version of Cuda that "
                      "does not match')", fix)


def _nvcc_vs_every_build(ctx: Context) -> Iterator[Finding]:
    """A torch version given without its CUDA: when every published build of the release (PyPI, download.pytorch.org,
    the pytorch conda channel) is for another CUDA major than nvcc, whichever build it is refuses nvcc's extensions."""
    release = ctx.torch_release
    builds = sorted({v.cuda.release for v in release.variants}) if release else []
    if not builds or ctx.nvcc.major in {cuda.major for cuda in builds}:
        return
    listed = ", ".join(str(cuda) for cuda in builds)
    yield Finding("nvcc-torch-mismatch", E,
                  f"nvcc {ctx.nvcc} and torch {ctx.torch}'s CUDA differ in major version: every published build of "
                  f"torch {release.release} is for CUDA {listed}, and torch refuses to build extensions ('The detected "
                  "CUDA version mismatches the version that was used to compile PyTorch')",
                  f"use the nvcc of torch's CUDA (python -c 'import torch; print(torch.version.cuda)'; one of {listed}), "
                  f"or a torch release built for CUDA {ctx.nvcc.major}")


def rule_host_compiler(ctx: Context, suggest: bool) -> Iterator[Finding]:
    limits = ctx.facts.host_compilers(ctx.nvcc) if ctx.nvcc else None
    if not limits:
        return
    if ctx.gcc:
        major = ctx.gcc.major
        if limits.gcc_max is not None and major > limits.gcc_max:
            yield Finding("gcc-unsupported", E,
                          f"nvcc {ctx.nvcc.release} supports gcc up to {limits.gcc_max}; gcc {ctx.gcc} fails with "
                          f"'unsupported GNU version! gcc versions later than {limits.gcc_max} are not supported'",
                          f"use gcc {limits.gcc_max}: CC=gcc-{limits.gcc_max} CXX=g++-{limits.gcc_max} "
                          f"CUDAHOSTCXX=g++-{limits.gcc_max} (or nvcc -ccbin g++-{limits.gcc_max})")
        elif limits.gcc_min is not None and major < limits.gcc_min:
            yield Finding("gcc-unsupported", E, f"nvcc {ctx.nvcc.release} needs gcc >= {limits.gcc_min}; "
                          f"gcc {ctx.gcc} is too old", f"use gcc {limits.gcc_min} to {limits.gcc_max}")
    if ctx.clang:
        major = ctx.clang.major
        if limits.clang_max is not None and major > limits.clang_max:
            yield Finding("clang-unsupported", E,
                          f"nvcc {ctx.nvcc.release} supports clang up to {limits.clang_max}; clang {ctx.clang} is rejected",
                          f"use clang {limits.clang_max} (nvcc -ccbin clang++-{limits.clang_max}) or a supported gcc")
        elif limits.clang_min is not None and major < limits.clang_min:
            yield Finding("clang-unsupported", E, f"nvcc {ctx.nvcc.release} needs clang >= {limits.clang_min}",
                          f"use clang {limits.clang_min} to {limits.clang_max}")


def rule_cxx_standard(ctx: Context, suggest: bool) -> Iterator[Finding]:
    release = ctx.torch_release
    if not release:
        return
    std = release.cxx
    gcc_min = ctx.facts.cxx_gcc_min.get(std)
    if ctx.gcc and gcc_min and not at_least(ctx.gcc, gcc_min):
        yield Finding("cxx-standard-unsupported", E,
                      f"torch {release.release} headers need C++{std}; gcc {ctx.gcc} is older than {gcc_min} "
                      f"('#error C++{std} or later compatible compiler is required')",
                      f"use gcc >= {gcc_min}")
    nvcc_min = ctx.facts.cxx_nvcc_min.get(std)
    if ctx.nvcc and nvcc_min and ctx.nvcc.release < nvcc_min and not ctx.torch_is_cpu:
        yield Finding("cxx-standard-unsupported", E,
                      f"torch {release.release} extensions compile as C++{std}, which nvcc {ctx.nvcc.release} lacks",
                      f"use nvcc >= {nvcc_min}")


def rule_python(ctx: Context, suggest: bool) -> Iterator[Finding]:
    release = ctx.torch_release
    if not release or not ctx.python:
        return
    minor = Version(f"{ctx.python.major}.{ctx.python.minor}")
    conda = ctx.torch_variant is not None and ctx.torch_variant.channel != "pypi"
    wheels = None if conda else ctx.facts.python_tags(ctx.torch.version)
    if wheels:
        if minor not in wheels:
            listed = ", ".join(str(p) for p in wheels)
            yield Finding("python-unsupported", E,
                          f"torch {ctx.torch.version} has wheels for Python {listed}, not {ctx.python}",
                          f"use Python {wheels[-1]} (or another of {listed})")
        return
    low, high = ctx.torch_variant.python if ctx.torch_variant and ctx.torch_variant.python else release.python
    if not low <= minor <= high:
        yield Finding("python-unsupported", E,
                      f"torch {release.release} supports Python {low} to {high}, not {ctx.python}",
                      f"use Python {low} to {high} (gptforge's environments use 3.12)")


# --- cuDNN ------------------------------------------------------------------------------------


def rule_cudnn(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if not ctx.cudnn:
        return
    yield from _cudnn_vs_cuda(ctx)
    yield from _cudnn_vs_torch(ctx)


def _cudnn_vs_cuda(ctx: Context) -> Iterator[Finding]:
    row = ctx.facts.cudnn_row(ctx.cudnn)
    if not row:
        return
    listed = row.cuda_text
    majors = {major for major, _ in row.cuda}
    for who, cuda in ctx.cuda_versions():
        if cuda.major not in majors:
            yield Finding("cudnn-cuda-mismatch", E,
                          f"cuDNN {ctx.cudnn} has no build for CUDA {cuda.major}.x ({who}; its builds: {listed})",
                          f"install the cuDNN {ctx.cudnn.major} build for CUDA {cuda.major} "
                          f"(e.g. nvidia-cudnn-cu{cuda.major}) or a cuDNN that supports CUDA {cuda.release}")
        elif (cuda.major, cuda.minor) not in row.cuda:
            yield Finding("cudnn-cuda-mismatch", W,
                          f"cuDNN {ctx.cudnn}'s support matrix lists CUDA {listed}, not {cuda.release} ({who})",
                          "use a cuDNN release whose support matrix lists this CUDA")
    for cc in ctx.ccs:
        if not row.cc_min <= cc <= row.cc_max:
            yield Finding("cudnn-arch-unsupported", E,
                          f"cuDNN {ctx.cudnn} supports CC {format_cc(row.cc_min)} to {format_cc(row.cc_max)}, "
                          f"not {format_cc(cc)}",
                          "use a cuDNN whose support matrix covers this GPU (9.10 still covers Maxwell to Volta)")


def _cudnn_vs_torch(ctx: Context) -> Iterator[Finding]:
    bundled = ctx.torch_cudnn or (ctx.torch_variant.cudnn if ctx.torch_variant else None)
    if not bundled:
        if ctx.torch and not ctx.torch_is_cpu:
            yield Finding("not-checked", INFO,
                          f"cuDNN {ctx.cudnn} against torch {ctx.torch}: not checked: no data for the cuDNN that "
                          "build bundles", "")
        return
    have, want = ctx.cudnn, bundled
    torch = f"torch {ctx.torch}" if ctx.torch else "torch"
    rows = load_table("cudnn.toml")["torch_check"]  # torch/backends/cudnn's check per release range
    check = release_row(rows, ctx.torch.version) if ctx.torch else None
    exact = check["minor"] == "equal" if check else False
    exact = exact or want.major < next(r["exact_below_major"] for r in rows if "exact_below_major" in r)
    if have.major != want.major:
        yield Finding("cudnn-torch-mismatch", E,
                      f"{torch} was built against cuDNN {want} but cuDNN {have} is loaded "
                      "('cuDNN version incompatibility')",
                      f"remove the other cuDNN from LD_LIBRARY_PATH so torch loads its own cuDNN {want}")
    elif exact and have.release[:2] != want.release[:2]:
        yield Finding("cudnn-torch-mismatch", E,
                      f"{torch} accepts only the cuDNN {want.major}.{want.minor} it was built with, not {have}: "
                      f"'cuDNN version mismatch: PyTorch was compiled against {want} but linked against {have}'",
                      f"load cuDNN {want.major}.{want.minor} (put it first on LD_LIBRARY_PATH), or use a torch built "
                      f"against cuDNN {have.major}.{have.minor}")
    elif have.release[:2] < want.release[:2]:
        yield Finding("cudnn-torch-mismatch", E,
                      f"{torch} was built against cuDNN {want}; the older cuDNN {have} is loaded: 'cuDNN version "
                      "incompatibility: PyTorch was compiled against ... but found runtime version ...'",
                      f"remove the older cuDNN from LD_LIBRARY_PATH so torch loads cuDNN {want.major}.{want.minor} "
                      "or newer")
    elif ctx.torch is None and have.release[:2] != want.release[:2]:
        yield Finding("cudnn-torch-mismatch", W,
                      f"torch before 1.0 accepts only the cuDNN {want.major}.{want.minor} it was built with, not {have}; "
                      "later releases accept a newer minor",
                      f"give --torch to judge it, or load cuDNN {want.major}.{want.minor}")


def rule_torch_cpu_build(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.torch_is_cpu and ctx.ccs:
        yield Finding("torch-cpu-build", W, f"torch {ctx.torch} is a CPU build: the GPUs will not be used",
                      join_fixes(env_hint(ctx, suggest), "install a CUDA build of torch"))


RULES: tuple[Callable[[Context, bool], Iterator[Finding]], ...] = (
    rule_known_versions,
    rule_driver,
    rule_gpu_newer_than_driver,
    rule_nvcc_arch,
    rule_torch_arch,
    rule_nvrtc_arch,
    rule_arch_list_env,
    rule_cpp_extension_arches,
    rule_arch_suffix_crash,
    rule_nvcc_torch,
    rule_apex_contrib,
    rule_host_compiler,
    rule_cxx_standard,
    rule_python,
    rule_cudnn,
    rule_fp8,
    rule_te_recipe,
    rule_flash_attn,
    rule_transformer_engine,
    rule_te_flash_attn,
    rule_deepspeed,
    rule_torch_cpu_build,
    rule_wheels,
    rule_flash_attn_wheel_build,
    rule_flash_attn_source_build,
    *host_rules.RULES,
    *nccl_rules.RULES,
)


def run_rules(combo: Combination, *, suggest: bool = True) -> list[Finding]:
    ctx = build_context(combo, facts())
    ctx.judge = _judge
    found = list(ctx.problems)
    for rule in RULES:
        found.extend(rule(ctx, suggest))
    return in_order(unique(found))


def check(combo: Combination) -> list[Finding]:
    """Judge a combination: findings sorted errors first; ``is_ok(findings)`` when none is an error.

    Errors one torch build / nvcc change resolves point to that move, said once (compat/moves.py)."""
    from gptforge.compat.moves import combine

    if combo.gpu_choices:
        return judge_each_choice(combo, check)
    findings = combine(combo, run_rules(combo, suggest=True), facts(), lambda c: run_rules(c, suggest=False))
    return in_order(findings)


def recommend(driver: str | DriverVersion | None, ccs: Iterable[CC] = ()) -> project_envs.Recommendation:
    """Which of the project's environments fits a machine, each judged by these rules (without hints)."""
    return project_envs.recommend(driver, ccs, _judge)


def _judge(combo: Combination) -> list[Finding]:
    return run_rules(combo, suggest=False)