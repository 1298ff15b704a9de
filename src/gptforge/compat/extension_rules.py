"""Training extensions against the combination: apex's contrib modules, FP8, TransformerEngine (and its
recipes), flash-attn and DeepSpeed (facts: data/extensions.toml); and, on a live machine, why TransformerEngine
does not import."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from packaging.version import Version

from gptforge.compat.arch_rules import arch_list_fix
from gptforge.compat.arches import CC, Arch, parse_arch, runs_on
from gptforge.compat.context import Context
from gptforge.compat.facts import release_row
from gptforge.compat.findings import Finding, Severity, no_data
from gptforge.compat.rule_helpers import at_least
from gptforge.compat.wheel_rules import flash_attn_releases
from gptforge.core.versions import format_cc, parse_cuda

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def rule_apex_contrib(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.combo.apex is None:
        return
    needs = ctx.facts.extensions["apex"]["contrib"]
    skipped = []
    for module, spec in sorted(needs.items()):
        have = ctx.cudnn if "cudnn_min" in spec else ctx.nccl
        minimum = Version(spec.get("cudnn_min") or spec["nccl_min"])
        if have is not None and not at_least(have, minimum):
            kind = "cuDNN" if "cudnn_min" in spec else "NCCL"
            skipped.append(f"{module} ({kind} >= {minimum})")
    if skipped:
        yield Finding("apex-contrib-skipped", INFO,
                      "apex will silently skip these contrib extensions: " + ", ".join(skipped),
                      "only needed if you use them: install a newer cuDNN / NCCL before building apex")


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
    table = ctx.facts.extensions.get("flash_attn", [])
    series = flash_attn_series(ctx.flash_attn)
    if not series:
        row = release_row(table, ctx.flash_attn)
        if row is None:
            yield no_data(f"flash-attn {ctx.flash_attn} (its nvcc floor and GPUs)")
            return
        yield from (finding for _, finding in _flash_attn_findings(ctx, row))
        return
    # A version without its patch ("2", "2.4") is every release of that series: an error only where each of them
    # gives it, a warning naming the releases where only some do.
    by_release = {release: release_row(table, release) for release in series}
    judged = {release: dict(_flash_attn_findings(ctx, row)) for release, row in by_release.items() if row}
    if len(judged) < len(series):
        yield no_data(f"flash-attn {', '.join(str(r) for r in series if not by_release[r])} "
                      "(their nvcc floor and GPUs)")
    keys = dict.fromkeys(key for found in judged.values() for key in found)
    for key in keys:
        hit = [release for release, found in judged.items() if key in found]
        finding = judged[hit[0]][key]
        if len(hit) == len(series):
            yield finding
        else:
            yield replace(finding, severity=W, message=f"{finding.message} (flash-attn {_span(hit)} of the "
                                                      f"{ctx.flash_attn}.x releases)")


def flash_attn_series(version: Version) -> list[Version]:
    """The published releases a version given without its patch stands for ("2" -> 2.0.0 .. 2.8.3.post1); none
    for a full version."""
    if len(version.release) >= 3 or version.pre or version.post or version.dev or version.local:
        return []
    return sorted(release for release in map(Version, flash_attn_releases())
                  if release.release[:len(version.release)] == version.release)


def _span(releases: list[Version]) -> str:
    return str(releases[0]) if len(releases) == 1 else f"{releases[0]} to {releases[-1]}"


def _flash_attn_findings(ctx: Context, row: dict) -> Iterator[tuple[tuple, Finding]]:
    """What one flash-attn release row says, each finding keyed by what it is about (nvcc, or a GPU)."""
    need = parse_cuda(row["nvcc_min"])
    if ctx.nvcc and ctx.nvcc.release < need and "flash_attn" not in ctx.prebuilt:  # a wheel needs no nvcc
        torch_cuda = ctx.torch_cuda
        matched = f"nvcc {torch_cuda.release}" if torch_cuda and torch_cuda.release >= need else f"nvcc >= {need}"
        error = row.get("nvcc_error", f"FlashAttention is only supported on CUDA {need} and above")
        yield ("nvcc",), Finding(
            "flash-attn-unsupported", E,
            f"flash-attn {ctx.flash_attn} builds only with nvcc >= {need}, not {ctx.nvcc.release}: '{error}'",
            f"use {matched} (flash-attn {ctx.flash_attn} needs nvcc >= {need}), or a flash-attn release "
            "whose floor your nvcc meets")
    low = parse_arch(row["cc_min"]).cc
    high = parse_arch(row["cc_max"]).cc if "cc_max" in row else None
    sass = _flash_attn_kernels(ctx, row)
    built_by = f" with nvcc {ctx.nvcc.release}" if ctx.nvcc and "flash_attn" not in ctx.prebuilt else ""
    for cc in ctx.ccs:
        if cc < low or (high and cc[0] > high[0]):
            span = f"CC {row['cc_min']}" + (f" to {row['cc_max']}" if high else "+")
            yield ("gpu", cc), Finding("flash-attn-arch-unsupported", E,
                                       f"flash-attn {ctx.flash_attn} supports {span}, not CC {format_cc(cc)}",
                                       "use torch's scaled_dot_product_attention (no flash-attn) on this GPU")
        elif sass and not any(runs_on(a, cc) for a in sass):
            yield ("gpu", cc), Finding(
                "flash-attn-arch-unsupported", E,
                f"flash-attn {ctx.flash_attn} has no kernels for CC {format_cc(cc)} "
                f"(it builds {' '.join(a.sm for a in sass)}{built_by}): 'no kernel image is available'",
                "use a flash-attn release (and nvcc) with kernels for this GPU, "
                "or torch's scaled_dot_product_attention")


def _flash_attn_kernels(ctx: Context, row: dict) -> list[Arch]:
    """The cubins a flash-attn release builds: every arch of its setup.py whose nvcc floor the nvcc building it
    meets. A prebuilt wheel was not built by the nvcc given, so it may hold any of them."""
    sass = [parse_arch(a) for a in row.get("sass", "").split()]
    nvcc = ctx.nvcc if "flash_attn" not in ctx.prebuilt else None
    if nvcc is None:
        return sass
    floors = {parse_arch(a): parse_cuda(v) for a, v in row.get("sass_nvcc", {}).items()}
    return [a for a in sass if a not in floors or nvcc.release >= floors[a]]


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
    if ctx.cudnn and not at_least(ctx.cudnn, Version(row["cudnn_min"])):
        reasons.append(f"cuDNN {ctx.cudnn} is below {row['cudnn_min']}")
    if ctx.torch and "torch_min" in row and ctx.torch.version < Version(row["torch_min"]):
        reasons.append(f"torch {ctx.torch.version} is below {row['torch_min']}")
    if ctx.gcc and "gcc_min" in row and not at_least(ctx.gcc, Version(row["gcc_min"])):
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


def rule_te_flash_attn(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """The flash-attn versions TE's attention accepts: outside them older releases fail, newer ones fall back."""
    if ctx.transformer_engine is None or ctx.flash_attn is None:
        return
    te = f"TransformerEngine {ctx.transformer_engine}"
    row = release_row(ctx.facts.extensions["transformer_engine"]["flash_attn"], ctx.transformer_engine)
    if row is None:
        yield no_data(f"the flash-attn versions {te} accepts")
        return
    blackwell = "flash_min_blackwell" in row and any(cc >= (10, 0) for cc in ctx.ccs)
    low = Version(row["flash_min_blackwell" if blackwell else "flash_min"])
    high = Version(row["flash_max"]) if "flash_max" in row else None
    flash = Version(ctx.flash_attn.public)
    if low <= flash and (high is None or flash <= high):
        return
    if "on_cc_min" in row and ctx.ccs and all(cc < parse_arch(row["on_cc_min"]).cc for cc in ctx.ccs):
        return  # TE does not use flash-attn on these GPUs
    span = f"{low} to {high}" if high else f"{low} or newer"
    pin = f"flash-attn>={low},<={high}" if high else f"flash-attn>={low}"
    if row["outside"] == "error":
        bound = f"minimum version {low} is required" if flash < low else f"maximum version {high} is supported"
        yield Finding("te-flash-attn-version", E,
                      f"{te} accepts flash-attn {span}, not {flash}: AssertionError 'FlashAttention {bound}.'",
                      f"pip install '{pin}', or set NVTE_FLASH_ATTN=0")
    else:
        yield Finding("te-flash-attn-version", W,
                      f"{te} accepts flash-attn {span}, not {flash}: it logs 'Supported flash-attn versions are "
                      f"...' and runs attention without flash-attn", f"pip install '{pin}' to have TE use it")


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
                      f"({spec['arch_suffix_error']})", arch_list_fix(ctx, allow_suffix=False) + " (no a/f suffix)")


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


# Why transformer_engine.pytorch does not import, from its import error: TE's loader prefers a system cuDNN
# (CUDNN_HOME, CUDNN_PATH, CUDA_HOME, /usr/local/cuda, then the loader's path) to the pip one torch loads; beside
# torch's, a sub-library of the system one fails with an undefined symbol, or torch's own check reports a "cuDNN
# version incompatibility" after the import.
CUDNN_CLASH = ("libcudnn", "cuDNN version incompatibility")


def te_import_failure(version: str | None, error: str | None, pip_cudnn_lib: str | None,
                      torch_cudnn: str | None) -> Finding:
    """The finding for a TransformerEngine VERSION whose import failed with ERROR; PIP_CUDNN_LIB: torch's own
    cuDNN folder (site-packages/nvidia/cudnn/lib) or None; TORCH_CUDNN: the cuDNN version torch reports."""
    version = version or "(version unknown)"
    if pip_cudnn_lib and any(mark in (error or "") for mark in CUDNN_CLASH):
        return Finding("te-system-cudnn", Severity.ERROR,
                       f"TransformerEngine {version} does not import: its loader prefers a system cuDNN, which clashes with "
                       f"torch's own (cuDNN {torch_cudnn or '?'} in {pip_cudnn_lib}): {error}",
                       f"export LD_LIBRARY_PATH={pip_cudnn_lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} (torch's cuDNN "
                       "first, for TE and every cuDNN sub-library), or remove the system cuDNN")
    return Finding("te-import-failed", Severity.ERROR,
                   f"TransformerEngine {version} is installed but transformer_engine.pytorch does not import: {error}",
                   "reinstall with pip install --no-build-isolation 'transformer_engine[pytorch]==<same version>' "
                   "against the torch installed now")
