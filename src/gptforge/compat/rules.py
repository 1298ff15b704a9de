"""The rules: each reads a parsed Combination and yields Findings with stable codes.

Facts come from compat/data/ through ``facts()``; nothing here hard-codes a version table.
A rule skips what it does not know. ``check`` runs them all and returns the findings sorted
(errors first), so the result does not depend on the order of the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from packaging.version import Version

from gptforge.compat import host_rules, project_envs
from gptforge.compat.arches import CC, Arch, best_cubin, parse_arch, ptx_runs_on, runs_on
from gptforge.compat.combination import Combination
from gptforge.compat.context import Context, build_context
from gptforge.compat.facts import facts, load_table, release_row
from gptforge.compat.findings import Finding, Severity, no_data, unique
from gptforge.core.versions import CudaVersion, DriverVersion, format_cc, parse_cuda
from gptforge.compat.wheel_rules import rule_wheels

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def _at_least(version: Version, minimum: Version) -> bool:
    """Compare only the components the user gave: gcc '11' satisfies a minimum of 11.3."""
    given = len(version.release)
    return version.release >= minimum.release[:given]


def _env_hint(ctx: Context, suggest: bool, *, driver: DriverVersion | None = None) -> str | None:
    """'use the cuda-12-6 environment: pixi run -e cuda-12-6 setup (without pixi: ...)' for this machine."""
    if not suggest:
        return None
    env = recommend(driver or ctx.driver, ctx.ccs).chosen
    if env is None or env.cuda is None:
        return None
    return f"use the {env.name} environment: {env.install_hint}"


def _join(*parts: str | None) -> str:
    return "; or ".join(p for p in parts if p)


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
    elif ctx.torch_release and ctx.torch_cuda and ctx.torch_variant is None:
        have = ", ".join(sorted({v.cuda.tag for v in ctx.torch_release.variants}))
        yield Finding("torch-cuda-variant-unknown", W,
                      f"no published torch {ctx.torch_release.release} build for CUDA {ctx.torch_cuda} (known: {have})",
                      f"install one of the published builds ({have})")


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
                          _join(_env_hint(ctx, suggest), f"upgrade the NVIDIA driver to >= {floor}"))
        elif toolkit and ctx.driver < toolkit and (jit := _needs_ptx_jit(ctx, cuda)):
            yield Finding("ptx-newer-than-driver", E,
                          f"driver {ctx.driver} runs {who} only through minor-version compatibility (the toolkit's "
                          f"own driver is {toolkit}), and a CUDA program nvcc builds with its default arch "
                          f"({jit[0].sm}) reaches CC {format_cc(jit[1])} only through PTX, which this driver cannot "
                          "JIT-compile: 'the provided PTX was compiled with an unsupported toolchain' "
                          "(cudaErrorUnsupportedPtxVersion)",
                          f"upgrade the driver to >= {toolkit}, or build SASS for the GPU "
                          f"(-arch=sm_{jit[1][0]}{jit[1][1]}, CMAKE_CUDA_ARCHITECTURES={jit[1][0]}{jit[1][1]})")
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


# --- architectures --------------------------------------------------------------------------


def _cudas_targeting(ctx: Context, cc: CC) -> list[CudaVersion]:
    return [CudaVersion(*key) for key, arches in sorted(ctx.facts.arches.items())
            if best_cubin(list(arches), cc, allow_suffix=False)]


def _arch_env_unset(ctx: Context) -> bool:
    return ctx.combo.torch_cuda_arch_list_env in (None, "", "native")


def implied_arch(ctx: Context, cc: CC) -> Arch:
    """What cpp_extension builds for a visible GPU when TORCH_CUDA_ARCH_LIST is unset: the GPU's own
    arch, capped by the highest SASS arch of the torch build (torch/utils/cpp_extension.py)."""
    sass = [a.cc for a in ctx.torch_arches or ()]
    return Arch(*min(cc, max(sass))) if sass else Arch(*cc)


def rule_nvcc_arch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    targetable = ctx.facts.targetable(ctx.nvcc) if ctx.nvcc else None
    if not targetable:
        return
    for cc in ctx.ccs:
        implied = implied_arch(ctx, cc)
        if best_cubin(list(targetable), cc, allow_suffix=False) is None:
            able = _cudas_targeting(ctx, cc)
            span = f"CUDA {able[0]} to {able[-1]}" if able else "no CUDA in gptforge's tables"
            yield Finding("gpu-arch-unsupported", E,
                          f"nvcc {ctx.nvcc} cannot generate code for CC {format_cc(cc)} (sm_{cc[0]}{cc[1]}); "
                          f"{span} can",
                          _join(_env_hint(ctx, suggest), f"use a CUDA toolkit from {span}"))
        elif _arch_env_unset(ctx) and implied not in targetable:
            able = [CudaVersion(*key) for key, arches in sorted(ctx.facts.arches.items()) if implied in arches]
            newer = f"use nvcc {able[0]} or newer" if able else None
            yield Finding("gpu-arch-unsupported", E,
                          f"TORCH_CUDA_ARCH_LIST is unset, so torch's cpp_extension builds for the GPU's own arch "
                          f"(compute_{implied.major}{implied.minor}), which nvcc {ctx.nvcc} cannot target: "
                          "'nvcc fatal : Unsupported gpu architecture'",
                          _join(newer, _arch_list_fix(ctx, allow_suffix=False)))


def _beyond_torch_cuda(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """With the build's arch list unknown: a GPU of a newer major than any arch torch's CUDA can target has no
    kernels in that build, neither torch's nor its CUDA libraries' (cuBLAS, cuDNN)."""
    targetable = ctx.facts.targetable(ctx.torch_cuda) if ctx.torch_cuda and not ctx.torch_is_cpu else None
    if not targetable:
        return
    top = max(a.cc for a in targetable if not a.suffix)
    for cc in ctx.ccs:
        if cc[0] > top[0]:
            yield Finding("gpu-arch-not-in-torch", E,
                          f"torch's CUDA {ctx.torch_cuda.release} targets architectures up to sm_{top[0]}{top[1]}, so "
                          f"this build and its CUDA libraries have no kernels for CC {format_cc(cc)}: 'no kernel image "
                          "is available for execution on the device'",
                          _join(_env_hint(ctx, suggest), "install a torch build for a CUDA that targets "
                                f"sm_{cc[0]}{cc[1]} (see torch's published builds)"))


def rule_torch_arch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.torch_arches is None:
        if ctx.torch_variant and ctx.ccs and not ctx.torch_is_cpu:
            yield Finding("not-checked", INFO, f"the GPUs against torch {ctx.torch}: not checked: no data for the "
                          "arches that build carries", "give them with --torch-arch-list (torch.cuda.get_arch_list())")
        yield from _beyond_torch_cuda(ctx, suggest)
        return
    if ctx.torch_is_cpu:
        return
    listed = " ".join(a.sm for a in ctx.torch_arches)
    # PTX carries a build to newer GPUs when it is of its highest arch (the "+PTX" torch puts on the last one);
    # 1.x builds' compute_37 beside sm_75 is Kepler's, and only some of their libraries hold it.
    top = max((a.cc for a in ctx.torch_arches), default=(0, 0))
    forward = [a for a in ctx.torch_ptx if a.cc >= top]
    for cc in ctx.ccs:
        if any(runs_on(a, cc) for a in ctx.torch_arches):
            continue
        if any(ptx_runs_on(a, cc) for a in forward):
            yield Finding("gpu-arch-ptx-jit", INFO,
                          f"torch has no sm_{cc[0]}{cc[1]} kernels; the driver JIT-compiles its PTX at first use",
                          "expect a slow first start; a torch build with this arch avoids it")
            continue
        yield Finding("gpu-arch-not-in-torch", E,
                      f"this torch build has no kernels for CC {format_cc(cc)} (it has {listed}): "
                      "'no kernel image is available for execution on the device'",
                      _join(_env_hint(ctx, suggest), "install a torch build whose arch list includes "
                            f"sm_{cc[0]}{cc[1]}"))


def rule_arch_list_env(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.arch_env is None:
        return
    sass, ptx = ctx.arch_env
    targetable = ctx.facts.targetable(ctx.nvcc) if ctx.nvcc else None
    if targetable:
        bad = [a for a in sass if a not in targetable]
        if bad:
            yield Finding("arch-list-untargetable", E,
                          f"TORCH_CUDA_ARCH_LIST has {' '.join(map(str, bad))}, which nvcc {ctx.nvcc} cannot target: "
                          f"'nvcc fatal : Unsupported gpu architecture'",
                          _arch_list_fix(ctx, allow_suffix=True))
    for cc in ctx.ccs:
        if not any(runs_on(a, cc) for a in sass) and not any(ptx_runs_on(a, cc) for a in ptx):
            yield Finding("arch-list-misses-gpu", E,
                          f"TORCH_CUDA_ARCH_LIST={ctx.combo.torch_cuda_arch_list_env} builds nothing that runs on "
                          f"CC {format_cc(cc)}", _arch_list_fix(ctx, allow_suffix=True))


def rule_cpp_extension_arches(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """torch's cpp_extension checks TORCH_CUDA_ARCH_LIST against its own table, whatever nvcc can do."""
    release = ctx.torch_release
    if ctx.arch_env is None or release is None:
        return
    sass, ptx = ctx.arch_env
    unknown = sorted({str(a) for a in [*sass, *ptx] if release.extension.rejected(str(a))})
    if unknown:
        listed = " ".join(unknown)
        yield Finding("arch-list-unknown-to-torch", E,
                      f"torch {release.release}'s cpp_extension does not know {listed} in TORCH_CUDA_ARCH_LIST: "
                      f"'ValueError: Unknown CUDA arch ({unknown[0]}) or GPU not supported'",
                      f"remove {listed} from TORCH_CUDA_ARCH_LIST, or use a torch release whose cpp_extension "
                      "knows it")


def rule_arch_suffix_crash(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """TORCH_CUDA_ARCH_LIST unset: cpp_extension reads torch's own arch list; older parsers crash on 'sm_90a'."""
    release = ctx.torch_release
    suffixed = [a for a in ctx.torch_arches or () if a.suffix]
    if not (release and suffixed and ctx.ccs and _arch_env_unset(ctx)):
        return
    plain = ";".join(sorted({format_cc(implied_arch(ctx, cc).cc) for cc in ctx.ccs}))
    if release.extension.suffix_crash:
        yield Finding("arch-list-suffix-crash", E,
                      f"torch {release.release}'s cpp_extension parses its own arch list ({suffixed[0].sm}) with int() "
                      "when TORCH_CUDA_ARCH_LIST is unset: 'invalid literal for int() with base 10: "
                      f"'{suffixed[0].major}{suffixed[0].minor}{suffixed[0].suffix}''",
                      f"set TORCH_CUDA_ARCH_LIST={plain} before building extensions")
    elif release.extension.suffix_crash is None:
        yield Finding("not-checked", INFO,
                      f"not checked: no data on whether torch {release.release}'s cpp_extension parses {suffixed[0].sm}",
                      f"set TORCH_CUDA_ARCH_LIST={plain} to be safe")


def _arch_list_fix(ctx: Context, *, allow_suffix: bool) -> str:
    from gptforge.compat.archlist import arch_list_for
    from gptforge.errors import GptforgeError

    if ctx.nvcc and ctx.ccs:
        try:
            return f"set TORCH_CUDA_ARCH_LIST={arch_list_for(ctx.ccs, ctx.nvcc, allow_suffix=allow_suffix)}"
        except GptforgeError:
            pass
    return ("set TORCH_CUDA_ARCH_LIST to the compute capabilities of the GPUs present, e.g. 9.0 for H100 "
            "(nvidia-smi --query-gpu=compute_cap --format=csv)")


# --- toolkit against torch and host compilers ------------------------------------------------


def rule_nvcc_torch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    nvcc, torch_cuda = ctx.nvcc, ctx.torch_cuda
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


def rule_apex_contrib(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.combo.apex is None:
        return
    needs = ctx.facts.extensions["apex"]["contrib"]
    skipped = []
    for module, spec in sorted(needs.items()):
        have = ctx.cudnn if "cudnn_min" in spec else ctx.nccl
        minimum = Version(spec.get("cudnn_min") or spec["nccl_min"])
        if have is not None and not _at_least(have, minimum):
            kind = "cuDNN" if "cudnn_min" in spec else "NCCL"
            skipped.append(f"{module} ({kind} >= {minimum})")
    if skipped:
        yield Finding("apex-contrib-skipped", INFO,
                      "apex will silently skip these contrib extensions: " + ", ".join(skipped),
                      "only needed if you use them: install a newer cuDNN / NCCL before building apex")


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
    if ctx.gcc and gcc_min and not _at_least(ctx.gcc, gcc_min):
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
    check = release_row(load_table("cudnn.toml")["torch_check"], ctx.torch.version) if ctx.torch else None
    if check and check["minor"] == "equal" and have.release[:2] != want.release[:2]:
        yield Finding("cudnn-torch-mismatch", E,
                      f"{torch} accepts only the cuDNN {want.major}.{want.minor} it was built with, not {have}: "
                      f"'cuDNN version mismatch: PyTorch was compiled against {want} but linked against {have}'",
                      f"load cuDNN {want.major}.{want.minor} (put it first on LD_LIBRARY_PATH), or use a torch built "
                      f"against cuDNN {have.major}.{have.minor}")
    elif have.major != want.major:
        yield Finding("cudnn-torch-mismatch", E,
                      f"{torch} was built against cuDNN {want} but cuDNN {have} is loaded "
                      "('cuDNN version incompatibility')",
                      f"remove the other cuDNN from LD_LIBRARY_PATH so torch loads its own cuDNN {want}")
    elif have.release[:2] < want.release[:2]:
        # torch refuses an older runtime minor for cuDNN 8 ("compiled against (8, 3, 2) but linked
        # against (8, 0, 3)"); for cuDNN 9 the tables have no such report, so it is only a warning.
        yield Finding("cudnn-torch-mismatch", E if want.major < 9 else W,
                      f"{torch} ships cuDNN {want}; the older cuDNN {have} is loaded instead",
                      "remove the older cuDNN from LD_LIBRARY_PATH")


# --- FP8, TransformerEngine, DeepSpeed --------------------------------------------------------


def _fp8_blocker(ctx: Context, cc: CC) -> str | None:
    spec = ctx.facts.extensions["transformer_engine"]["fp8"]
    cc_min = parse_cuda(spec["cc_min"])
    if cc < (cc_min.major, cc_min.minor):
        return f"CC {format_cc(cc)} has no FP8 tensor cores (needs {spec['cc_min']}+)"
    ada = parse_cuda(spec["ada_cc"])
    cuda = ctx.torch_cuda  # FP8 runs through torch's CUDA runtime
    ada_min = parse_cuda(spec["ada_cuda_min"])
    if cc == (ada.major, ada.minor) and cuda and cuda.release < ada_min:
        return f"FP8 on Ada (CC {spec['ada_cc']}) needs CUDA >= {ada_min}, not {cuda.release}"
    return None


def rule_fp8(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if not ctx.ccs:
        return
    blockers = [_fp8_blocker(ctx, cc) for cc in ctx.ccs]
    if all(blockers):
        severity = E if ctx.combo.fp8 or ctx.combo.recipe else W if ctx.transformer_engine else INFO
        yield Finding("fp8-unavailable", severity, "FP8 training is unavailable: " + "; ".join(sorted(set(blockers))),
                      "train in bf16 (the default); FP8 needs an Ada (with CUDA >= 12.1), Hopper or Blackwell GPU")


def rule_te_recipe(ctx: Context, suggest: bool) -> Iterator[Finding]:
    recipes = ctx.facts.extensions["transformer_engine"]["recipes"]
    spec = recipes.get(ctx.combo.recipe) if ctx.combo.recipe else None
    if spec is None:
        return
    low = parse_arch(spec["cc_min"]).cc
    below = parse_arch(spec["cc_below"]).cc if "cc_below" in spec else None
    runs = [name for name, other in sorted(recipes.items()) if name != ctx.combo.recipe
            and all(parse_arch(other["cc_min"]).cc <= cc and ("cc_below" not in other or cc < parse_arch(other["cc_below"]).cc)
                    for cc in ctx.ccs)]
    instead = f"use the {' or '.join(runs)} recipe" if runs else "train in bf16"
    for cc in ctx.ccs:
        if cc < low or (below and cc >= below):
            span = f"CC {spec['cc_min']} to below {spec['cc_below']}" if below else f"CC {spec['cc_min']}+"
            yield Finding("te-recipe-unsupported", E,
                          f"TransformerEngine's {ctx.combo.recipe} recipe needs {span}, not CC {format_cc(cc)}",
                          instead)
    cuda_min = spec.get("cuda_min")
    if cuda_min and ctx.torch_cuda and ctx.torch_cuda.release < parse_cuda(cuda_min):
        yield Finding("te-recipe-unsupported", E,
                      f"TransformerEngine's {ctx.combo.recipe} recipe needs CUDA >= {cuda_min}, not torch's "
                      f"{ctx.torch_cuda.release}", f"use a torch build for CUDA >= {cuda_min}")


def rule_flash_attn(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.flash_attn is None:
        return
    row = release_row(ctx.facts.extensions.get("flash_attn", []), ctx.flash_attn)
    if row is None:
        yield no_data(f"flash-attn {ctx.flash_attn} (its nvcc floor and GPUs)")
        return
    need = parse_cuda(row["nvcc_min"])
    if ctx.nvcc and ctx.nvcc.release < need and "flash_attn" not in ctx.prebuilt:  # a wheel needs no nvcc
        torch_cuda = ctx.torch_cuda
        matched = f"nvcc {torch_cuda.release}" if torch_cuda and torch_cuda.release >= need else f"nvcc >= {need}"
        yield Finding("flash-attn-unsupported", E,
                      f"flash-attn {ctx.flash_attn} builds only with nvcc >= {need}, not {ctx.nvcc.release}: "
                      f"'FlashAttention is only supported on CUDA {need} and above'",
                      f"use {matched} (flash-attn {ctx.flash_attn} needs nvcc >= {need}), or a flash-attn release "
                      "whose floor your nvcc meets")
    low = parse_arch(row["cc_min"]).cc
    high = parse_arch(row["cc_max"]).cc if "cc_max" in row else None
    sass = [parse_arch(a) for a in row.get("sass", "").split()]
    if ctx.nvcc and ctx.nvcc.release < CudaVersion(11, 8):
        sass = [a for a in sass if a.cc < (9, 0)]
    for cc in ctx.ccs:
        if cc < low or (high and cc[0] > high[0]):
            span = f"CC {row['cc_min']}" + (f" to {row['cc_max']}" if high else "+")
            yield Finding("flash-attn-arch-unsupported", E,
                          f"flash-attn {ctx.flash_attn} supports {span}, not CC {format_cc(cc)}",
                          "use torch's scaled_dot_product_attention (no flash-attn) on this GPU")
        elif sass and not any(runs_on(a, cc) for a in sass):
            yield Finding("flash-attn-arch-unsupported", E,
                          f"flash-attn {ctx.flash_attn} has no kernels for CC {format_cc(cc)} "
                          f"(it builds {' '.join(a.sm for a in sass)}): 'no kernel image is available'",
                          "use a flash-attn release with kernels for this GPU, or torch's scaled_dot_product_attention")


def _te_reasons(ctx: Context, row: dict) -> list[str]:
    reasons = []
    if "cc_min" in row:
        low = parse_arch(row["cc_min"]).cc
        reasons += [f"CC {format_cc(cc)} is below {row['cc_min']}" for cc in ctx.ccs if cc < low]
    for who, cuda in ctx.cuda_versions():
        if cuda.release < parse_cuda(row["cuda_min"]):
            reasons.append(f"{who} is below {row['cuda_min']}")
        if "cuda_min_ada" in row and (8, 9) in ctx.ccs and cuda.release < parse_cuda(row["cuda_min_ada"]):
            reasons.append(f"Ada needs CUDA >= {row['cuda_min_ada']} ({who})")
        if ("cuda_min_blackwell" in row and any(cc[0] >= 10 for cc in ctx.ccs)
                and cuda.release < parse_cuda(row["cuda_min_blackwell"])):
            reasons.append(f"Blackwell needs CUDA >= {row['cuda_min_blackwell']} ({who})")
    if ctx.cudnn and not _at_least(ctx.cudnn, Version(row["cudnn_min"])):
        reasons.append(f"cuDNN {ctx.cudnn} is below {row['cudnn_min']}")
    if ctx.torch and "torch_min" in row and ctx.torch.version < Version(row["torch_min"]):
        reasons.append(f"torch {ctx.torch.version} is below {row['torch_min']}")
    if ctx.gcc and "gcc_min" in row and not _at_least(ctx.gcc, Version(row["gcc_min"])):
        reasons.append(f"gcc {ctx.gcc} is below {row['gcc_min']}")
    driver = ctx.facts.toolkit_driver(parse_cuda(row["driver_cuda"])) if "driver_cuda" in row else None
    if ctx.driver and driver and ctx.driver < driver:
        reasons.append(f"driver {ctx.driver} does not support CUDA {row['driver_cuda']} (it needs >= {driver}, "
                       "beyond minor-version compatibility)")
    return reasons


def rule_transformer_engine(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.transformer_engine is None:
        return
    te = f"TransformerEngine {ctx.transformer_engine}"
    row = release_row(ctx.facts.extensions["transformer_engine"]["requires"], ctx.transformer_engine)
    if row is None:
        yield no_data(f"{te}'s requirements", "compat/data/extensions.toml lists TransformerEngine 1.0 and later")
        return
    if ctx.ccs and "cc_min" not in row:
        yield no_data(f"the GPUs {te} supports (its README gives no floor)")
    if ctx.torch and "torch_min" not in row:
        yield no_data(f"the torch {te} needs (its setup.py gives no floor)")
    reasons = _te_reasons(ctx, row)
    if reasons:
        floors = ", ".join(f"{label} >= {row[key]}" for key, label in
                           (("cc_min", "CC"), ("cuda_min", "CUDA"), ("cudnn_min", "cuDNN"), ("torch_min", "torch"))
                           if key in row)
        yield Finding("te-unsupported", E, f"{te} cannot run here: " + "; ".join(reasons),
                      f"meet {te}'s floor ({floors}) or uninstall it")


def rule_deepspeed(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.deepspeed is None:
        return
    spec = ctx.facts.extensions["deepspeed"]
    floor = release_row(spec["torch"], ctx.deepspeed)
    if ctx.torch and floor is None:
        yield no_data(f"the torch DeepSpeed {ctx.deepspeed} needs")
    elif ctx.torch and ctx.torch.version < Version(floor["torch_min"]):
        yield Finding("deepspeed-unsupported", E,
                      f"DeepSpeed {ctx.deepspeed} needs torch >= {floor['torch_min']}, not {ctx.torch.version}",
                      f"use torch >= {floor['torch_min']}")
    yield from _deepspeed_cuda(ctx, spec)
    if ctx.arch_env and any(a.suffix for a in ctx.arch_env[0]):
        yield Finding("deepspeed-arch-suffix", E,
                      f"DeepSpeed's op builder cannot parse TORCH_CUDA_ARCH_LIST={ctx.combo.torch_cuda_arch_list_env} "
                      f"({spec['arch_suffix_error']})", _arch_list_fix(ctx, allow_suffix=False) + " (no a/f suffix)")


def _deepspeed_cuda(ctx: Context, spec: dict) -> Iterator[Finding]:
    nvcc, torch_cuda = ctx.nvcc, ctx.torch_cuda
    if not nvcc or not torch_cuda or nvcc.release == torch_cuda.release or ctx.torch_is_cpu:
        return
    row = release_row(spec["minor_mismatch_ok"], ctx.deepspeed)
    if row is None and nvcc.major == torch_cuda.major:
        yield no_data(f"the CUDA minors DeepSpeed {ctx.deepspeed} lets differ (nvcc {nvcc.release}, "
                       f"torch's {torch_cuda.release})", f"use nvcc {torch_cuda.release} to be safe")
        return
    ok = row["cuda"].get(str(nvcc.major), []) if row else []
    if nvcc.major == torch_cuda.major and str(nvcc.release) in ok and str(torch_cuda.release) in ok:
        yield Finding("deepspeed-cuda-mismatch", INFO,
                      f"DeepSpeed {ctx.deepspeed} accepts nvcc {nvcc.release} with torch's CUDA {torch_cuda.release} "
                      "(whitelisted minors)", "")
        return
    whitelisted = "" if ok or nvcc.major != torch_cuda.major else \
        f" (CUDA {nvcc.major}.x minors are not in its whitelist)"
    yield Finding("deepspeed-cuda-mismatch", E,
                  f"DeepSpeed {ctx.deepspeed}'s op builder rejects nvcc {nvcc.release} with torch's CUDA "
                  f"{torch_cuda.release}{whitelisted}: CUDAMismatchException",
                  f"use nvcc {torch_cuda.release}; or, at your own risk, set {spec['skip_check_env']}=1")


def rule_torch_cpu_build(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.torch_is_cpu and ctx.ccs:
        yield Finding("torch-cpu-build", W, f"torch {ctx.torch} is a CPU build: the GPUs will not be used",
                      _join(_env_hint(ctx, suggest), "install a CUDA build of torch"))


RULES: tuple[Callable[[Context, bool], Iterator[Finding]], ...] = (
    rule_known_versions,
    rule_driver,
    rule_gpu_newer_than_driver,
    rule_nvcc_arch,
    rule_torch_arch,
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
    rule_deepspeed,
    rule_torch_cpu_build,
    rule_wheels,
    *host_rules.RULES,
)


def run_rules(combo: Combination, *, suggest: bool = True) -> list[Finding]:
    ctx = build_context(combo, facts())
    found = list(ctx.problems)
    for rule in RULES:
        found.extend(rule(ctx, suggest))
    return sorted(unique(found), key=lambda f: (f.rank, f.code, f.message))


def check(combo: Combination) -> list[Finding]:
    """Judge a combination: findings sorted errors first; ``is_ok(findings)`` when none is an error.

    Errors one torch build / nvcc change resolves point to that move, said once (compat/moves.py)."""
    from gptforge.compat.moves import combine

    findings = combine(combo, run_rules(combo, suggest=True), facts(), lambda c: run_rules(c, suggest=False))
    return sorted(findings, key=lambda f: (f.rank, f.code, f.message))


def recommend(driver: str | DriverVersion | None, ccs: Iterable[CC] = ()) -> project_envs.Recommendation:
    """Which of the project's environments fits a machine, each judged by these rules (without hints)."""
    return project_envs.recommend(driver, ccs, lambda combo: run_rules(combo, suggest=False))
