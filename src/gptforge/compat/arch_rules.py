"""GPU architectures: what nvcc, the torch build and TORCH_CUDA_ARCH_LIST generate code for, against the GPUs
present (facts: data/cuda_arches.toml, torch.toml's cpp_extension behaviour)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from packaging.version import Version

from gptforge.compat.arches import CC, Arch, best_cubin, parse_arch, ptx_runs_on, runs_on
from gptforge.compat.context import Context
from gptforge.compat.facts import TorchVariant, load_table, release_row
from gptforge.compat.findings import Finding, Severity
from gptforge.compat.rule_helpers import env_hint, join_fixes
from gptforge.core.versions import CudaVersion, format_cc, parse_cuda

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def _cudas_targeting(ctx: Context, cc: CC) -> list[CudaVersion]:
    return [CudaVersion(*key) for key, arches in sorted(ctx.facts.arches.items())
            if best_cubin(list(arches), cc, allow_suffix=False)]


def _arch_env_unset(ctx: Context) -> bool:
    return ctx.combo.torch_cuda_arch_list_env in (None, "", "native")


def implied_arch(ctx: Context, cc: CC) -> Arch:
    """What cpp_extension builds for a visible GPU when TORCH_CUDA_ARCH_LIST is unset: the GPU's own
    arch, capped by the highest SASS arch of the torch build (torch/utils/cpp_extension.py; uncapped before 1.8)."""
    sass = [a.cc for a in ctx.torch_arches or ()]
    clamps = ctx.torch_release is None or ctx.torch_release.extension.clamps
    return Arch(*min(cc, max(sass))) if sass and clamps else Arch(*cc)


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
                          join_fixes(env_hint(ctx, suggest), f"use a CUDA toolkit from {span}"))
        elif _arch_env_unset(ctx) and (untargetable := _untargetable_builder(ctx, cc, implied, targetable)):
            builder, arch = untargetable
            able = [CudaVersion(*key) for key, arches in sorted(ctx.facts.arches.items()) if arch in arches]
            newer = f"use nvcc {able[0]} or newer" if able else None
            yield Finding("gpu-arch-unsupported", E,
                          f"TORCH_CUDA_ARCH_LIST is unset, so {builder} builds for the GPU's own arch "
                          f"(compute_{arch.major}{arch.minor}), which nvcc {ctx.nvcc} cannot target: "
                          "'nvcc fatal : Unsupported gpu architecture'",
                          join_fixes(newer, arch_list_fix(ctx, allow_suffix=False)))


def _untargetable_builder(ctx: Context, cc: CC, implied: Arch, targetable) -> tuple[str, Arch] | None:
    """(who, arch) where an extension build with TORCH_CUDA_ARCH_LIST unset asks nvcc for an arch it lacks:
    torch's cpp_extension, or DeepSpeed's JIT op builder, which adds each visible GPU's own arch uncapped."""
    if implied not in targetable:
        return (f"torch {ctx.torch_release.release}'s cpp_extension" if ctx.torch_release else "torch's cpp_extension",
                implied)
    own = Arch(*cc)
    if ctx.deepspeed is not None and ctx.facts.extensions["deepspeed"].get("jit_arch") == "visible-gpus" \
            and own not in targetable:
        return "DeepSpeed's JIT op builder (uncapped, unlike torch's cpp_extension)", own
    return None


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
                          join_fixes(env_hint(ctx, suggest), "install a torch build for a CUDA that targets "
                                f"sm_{cc[0]}{cc[1]} (see torch's published builds)"))


def _torch_floor(ctx: Context) -> CC | None:
    """The oldest CC any build of the torch release runs on (None: not recorded, or no torch given)."""
    row = release_row(load_table("torch.toml")["gpu_floor"], ctx.torch.version) if ctx.torch else None
    return parse_arch(row["cc"]).cc if row and not ctx.torch_is_cpu else None


def _below_torch_floor(ctx: Context, floor: CC) -> Iterator[Finding]:
    for cc in ctx.ccs:
        if cc < floor:
            yield Finding("gpu-too-old-for-torch", E,
                          f"torch {ctx.torch} does not support CC {format_cc(cc)}: 'PyTorch no longer supports this "
                          "GPU because it is too old'; no torch build has kernels for it",
                          f"use a GPU of CC {format_cc(floor)} or newer")


def rule_torch_arch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    floor = _torch_floor(ctx)
    if floor:
        yield from _below_torch_floor(ctx, floor)
    if ctx.torch_arches is None:
        if ctx.torch_variant and ctx.ccs and not ctx.torch_is_cpu:
            yield Finding("not-checked", INFO, f"the GPUs against torch {ctx.torch}: not checked: no data for the "
                          "arches that build carries", "give them with --torch-arch-list (torch.cuda.get_arch_list())")
        yield from _beyond_torch_cuda(ctx, suggest)
        if ctx.torch is None and ctx.torch_cuda and not ctx.torch_is_cpu:
            yield from _every_build_for_cuda(ctx, suggest)
        return
    if ctx.torch_is_cpu:
        return
    listed = " ".join(a.sm for a in ctx.torch_arches)
    # PTX carries a build to newer GPUs when it is of its highest arch (the "+PTX" torch puts on the last one);
    # 1.x builds' compute_37 beside sm_75 is Kepler's, and only some of their libraries hold it.
    top = max((a.cc for a in ctx.torch_arches), default=(0, 0))
    forward = [a for a in ctx.torch_ptx if a.cc >= top]
    for cc in ctx.ccs:
        if any(runs_on(a, cc) for a in ctx.torch_arches) or (floor and cc < floor):
            continue
        if any(ptx_runs_on(a, cc) for a in forward):
            yield Finding("gpu-arch-ptx-jit", INFO,
                          f"torch has no sm_{cc[0]}{cc[1]} kernels; the driver JIT-compiles its PTX at first use",
                          "expect a slow first start; a torch build with this arch avoids it")
            continue
        if ctx.pypi_default and (others := _builds_running_on(ctx, cc)):
            yield _default_build_lacks(ctx, cc, listed, others)
            continue
        yield Finding("gpu-arch-not-in-torch", E,
                      f"this torch build has no kernels for CC {format_cc(cc)} (it has {listed}): "
                      "'no kernel image is available for execution on the device'",
                      join_fixes(env_hint(ctx, suggest), "install a torch build whose arch list includes "
                            f"sm_{cc[0]}{cc[1]}"))


def _build_runs_on(build: TorchVariant, cc: CC) -> bool:
    """Does the build's recorded arch list run on the GPU: SASS, or PTX of its highest arch?"""
    top = max(a.cc for a in build.arches)
    return any(runs_on(a, cc) for a in build.arches) or any(ptx_runs_on(a, cc) for a in build.ptx if a.cc >= top)


def _builds_running_on(ctx: Context, cc: CC) -> list[TorchVariant]:
    """The published builds of the torch release whose recorded arch list runs on the GPU; a build whose list is
    not recorded is not counted."""
    return [build for build in ctx.torch_release.variants
            if build.arches is not None and build.covers(ctx.torch.version) and _build_runs_on(build, cc)]


def _every_build_for_cuda(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """torch's CUDA given without torch: where every recorded build for that CUDA (any release, any channel) lacks
    the GPU, whichever is installed fails on it; where only some lack it, which release is installed decides (the
    rule an untagged torch version follows against its release's builds, _default_build_lacks). Not judged while
    a build for that CUDA has no recorded arch list."""
    key = (ctx.torch_cuda.major, ctx.torch_cuda.minor)
    builds = [(release, build) for release in ctx.facts.torch.values() for build in release.variants
              if (build.cuda.major, build.cuda.minor) == key]
    targetable = ctx.facts.targetable(ctx.torch_cuda)
    if not builds or any(build.arches is None for _, build in builds) or not targetable:
        return
    top = max(a.cc for a in targetable if not a.suffix)
    for cc in ctx.ccs:
        if cc[0] > top[0]:
            continue  # beyond what the CUDA can target at all (_beyond_torch_cuda)
        running = sorted({release.release for release, build in builds if _build_runs_on(build, cc)}, key=Version)
        lacking = sorted({release.release for release, build in builds if not _build_runs_on(build, cc)},
                         key=Version)
        if running and lacking:
            yield Finding("gpu-arch-not-in-torch", W,
                          f"torch's builds for CUDA {ctx.torch_cuda.release} differ on CC {format_cc(cc)}: those of "
                          f"torch {', '.join(running)} have kernels for it, those of {', '.join(lacking)} do not",
                          "give the installed torch with --torch to judge it")
        elif lacking:
            yield Finding("gpu-arch-not-in-torch", E,
                          f"no recorded torch build for CUDA {ctx.torch_cuda.release} (torch {lacking[0]} to "
                          f"{lacking[-1]}) has kernels for CC {format_cc(cc)}: 'no kernel image is available for "
                          "execution on the device'",
                          join_fixes(env_hint(ctx, suggest), _cuda_with_builds_for(ctx, cc)))


def _cuda_with_builds_for(ctx: Context, cc: CC) -> str:
    cudas = sorted({build.cuda.release for release in ctx.facts.torch.values() for build in release.variants
                    if build.channel == "pypi" and build.arches is not None and _build_runs_on(build, cc)})
    newest = f" (the newest CUDA with one: {cudas[-1]})" if cudas else ""
    return f"install a torch build whose arch list includes sm_{cc[0]}{cc[1]}{newest}"


def _default_build_lacks(ctx: Context, cc: CC, listed: str, others: list[TorchVariant]) -> Finding:
    """torch given without its CUDA: PyPI's wheel lacks the GPU but other builds of the release carry it, so which
    build is installed decides (the rule nvcc follows against every build, rules._nvcc_vs_every_build)."""
    version = ctx.torch.version.public
    names = [f"torch=={version}+{b.cuda.tag}" if b.channel == "pypi" else f"{b.channel}'s CUDA {b.cuda} build"
             for b in others]
    return Finding("gpu-arch-not-in-torch", W,
                   f"PyPI's torch {version} wheel (the CUDA {ctx.torch_cuda.release} build `pip install torch=={version}` "
                   f"takes) has no kernels for CC {format_cc(cc)} (it has {listed}): 'no kernel image is available for "
                   f"execution on the device'; torch {ctx.torch_release.release}'s "
                   f"{', '.join(f'CUDA {b.cuda}' for b in others)} build runs on it",
                   f"install {' or '.join(names)} (give the build with --torch {version}+cuXYZ to judge it)")


@cache
def _nvrtc_caps() -> list[tuple[Version, CudaVersion, str]]:
    """(the first torch release of a table, the newest nvrtc it caps the arch for, source), oldest first."""
    rows = load_table("torch.toml")["nvrtc_arch_cap"]
    return sorted((Version(r["since"]), parse_cuda(r["nvrtc_capped"]), r["source"]) for r in rows)


def rule_nvrtc_arch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """torch's runtime compilers ask its CUDA's nvrtc for the GPU's own arch where its cap table stops short of that
    nvrtc: an nvrtc older than the GPU rejects the arch (torch.toml [[nvrtc_arch_cap]]). A warning: only code that
    reaches those compilers fails, and the same build runs other programs on that GPU (a cu110 torch 1.7.0 on an
    RTX 3090: aim-uofa/AdelaiDepth#79 runs, WisconsinAIVision/yolact_edge#107 fails in TorchScript)."""
    nvrtc = ctx.torch_cuda
    targetable = ctx.facts.targetable(nvrtc) if nvrtc and ctx.torch and not ctx.torch_is_cpu else None
    caps = [cap for cap in _nvrtc_caps() if cap[0] <= Version(ctx.torch.version.public)] if targetable else []
    if not caps or nvrtc.release <= caps[-1][1]:
        return
    top = max(a.cc for a in targetable if not a.suffix)
    fixed = next((since for since, capped, _ in _nvrtc_caps() if nvrtc.release <= capped), None)
    for cc in ctx.ccs:
        if cc[0] > top[0] or Arch(*cc) in targetable:
            continue  # a GPU of a newer major has no kernels at all (gpu-arch-not-in-torch says so)
        able = [CudaVersion(*key) for key, arches in sorted(ctx.facts.arches.items()) if Arch(*cc) in arches]
        yield Finding("nvrtc-arch-unsupported", W,
                      f"torch {ctx.torch.version.public} compiles TorchScript-fused and jiterator kernels at run time "
                      f"for the GPU's own arch (compute_{cc[0]}{cc[1]}) with the nvrtc of its CUDA {nvrtc.release}, "
                      "which does not know it: code that reaches them fails with 'nvrtc: error: invalid value for "
                      "--gpu-architecture (-arch)' (eager kernels run)",
                      join_fixes(env_hint(ctx, suggest),
                                 f"use torch >= {fixed} (it caps the arch at what nvrtc {nvrtc.release} knows)"
                                 if fixed else None,
                                 f"a torch build for CUDA >= {able[0]}" if able else None))


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
                          arch_list_fix(ctx, allow_suffix=True))
    for cc in ctx.ccs:
        if not any(runs_on(a, cc) for a in sass) and not any(ptx_runs_on(a, cc) for a in ptx):
            yield Finding("arch-list-misses-gpu", E,
                          f"TORCH_CUDA_ARCH_LIST={ctx.combo.torch_cuda_arch_list_env} builds nothing that runs on "
                          f"CC {format_cc(cc)}", arch_list_fix(ctx, allow_suffix=True))


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


def arch_list_fix(ctx: Context, *, allow_suffix: bool) -> str:
    from gptforge.compat.archlist import arch_list_for
    from gptforge.errors import GptforgeError

    if ctx.nvcc and ctx.ccs:
        try:
            return f"set TORCH_CUDA_ARCH_LIST={arch_list_for(ctx.ccs, ctx.nvcc, allow_suffix=allow_suffix)}"
        except GptforgeError:
            pass
    return ("set TORCH_CUDA_ARCH_LIST to the compute capabilities of the GPUs present, e.g. 9.0 for H100 "
            "(nvidia-smi --query-gpu=compute_cap --format=csv)")
