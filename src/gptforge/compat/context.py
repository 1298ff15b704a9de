"""A Combination with every field parsed once, for the rules to read.

Fields that are None stay None (rules skip them); a field that cannot be parsed becomes None
too, and is reported once as an ``unreadable-version`` warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.version import Version

from gptforge.compat.arches import CC, Arch, parse_arch, parse_arch_list
from gptforge.compat.combination import Combination
from gptforge.compat.facts import ArchList, Facts, TorchRelease, TorchVariant
from gptforge.compat.host_libs import parse_glibc, parse_glibcxx
from gptforge.compat.wheels import PROJECT_FIELDS, WheelBuild, read_wheel
from gptforge.compat.findings import Finding, Severity
from gptforge.core.versions import (
    CudaVersion,
    DriverVersion,
    TorchVersion,
    VersionError,
    parse_clang,
    parse_cuda,
    parse_cudnn,
    parse_driver,
    parse_gcc,
    parse_nccl,
    parse_python,
    parse_release,
    parse_torch,
)


@dataclass
class Context:
    combo: Combination
    facts: Facts
    driver: DriverVersion | None = None
    ccs: tuple[CC, ...] = ()
    nvcc: CudaVersion | None = None
    torch: TorchVersion | None = None
    torch_cuda: CudaVersion | None = None
    torch_release: TorchRelease | None = None
    torch_variant: TorchVariant | None = None
    torch_arches: tuple[Arch, ...] | None = None
    torch_ptx: tuple[Arch, ...] = ()
    python: Version | None = None
    gcc: Version | None = None
    clang: Version | None = None
    cudnn: Version | None = None
    nccl: Version | None = None
    deepspeed: Version | None = None
    transformer_engine: Version | None = None
    flash_attn: Version | None = None
    glibc: Version | None = None
    libstdcxx: Version | None = None
    torch_cudnn: Version | None = None
    arch_env: tuple[list[Arch], list[Arch]] | None = None
    wheels: tuple[WheelBuild, ...] = ()
    pypi_default: bool = False  # torch_cuda is that of PyPI's wheel of an untagged torch version
    prebuilt: frozenset[str] = frozenset()  # fields whose version came from a prebuilt wheel
    problems: list[Finding] = field(default_factory=list)
    # every rule, without hints: what a hint judges the project's environments with (set by run_rules)
    judge: Callable[[Combination], list[Finding]] | None = None

    @property
    def torch_is_cpu(self) -> bool:
        return bool(self.torch and self.torch.is_cpu)

    def cuda_versions(self) -> list[tuple[str, CudaVersion]]:
        """(who, version) for torch's CUDA and nvcc, without duplicates."""
        found: list[tuple[str, CudaVersion]] = []
        if self.torch_cuda:
            found.append((f"torch's CUDA {self.torch_cuda}", self.torch_cuda))
        if self.nvcc and (not self.torch_cuda or self.nvcc.release != self.torch_cuda.release):
            found.append((f"nvcc {self.nvcc}", self.nvcc))
        return found


def _read(ctx: Context, name: str, value, parser):
    if value is None:
        return None
    try:
        return parser(value)
    except VersionError as err:
        ctx.problems.append(
            Finding("unreadable-version", Severity.WARNING, f"{name}: {err}; the rules that need it were skipped",
                    f"give {name} in the documented form (gptforge compat check --help)")
        )
        return None


def _torch_arches(ctx: Context) -> None:
    """torch.cuda.get_arch_list() style: 'sm_90' is SASS, 'compute_120' (or '12.0+PTX') is PTX."""
    listed = ctx.combo.torch_arch_list
    if listed is not None:
        sass, ptx = [], []
        for item in listed:
            arch = _read(ctx, "torch_arch_list", item.removesuffix("+PTX"), parse_arch)
            if arch is None:
                continue
            is_ptx = item.lower().startswith("compute_")
            (ptx if is_ptx else sass).append(arch)
            if item.endswith("+PTX"):
                ptx.append(arch)
        ctx.torch_arches, ctx.torch_ptx = tuple(sass), tuple(ptx)
    elif wheel := _wheel_arches(ctx):
        ctx.torch_arches, ctx.torch_ptx = wheel
    elif ctx.torch_variant and ctx.torch_variant.arches is not None and ctx.torch_variant.covers(ctx.torch.version):
        ctx.torch_arches, ctx.torch_ptx = ctx.torch_variant.arches, ctx.torch_variant.ptx


def _wheel_arches(ctx: Context) -> ArchList | None:
    """The arch list read from this version's PyPI wheel, where the torch is that wheel: an untagged version taken
    from PyPI, or a +cuXYZ build of the wheel's CUDA. A version given with only its CUDA may as well be the pytorch
    channel's conda package, whose list differs (the cu102 packages of 1.7 to 1.12 carry sm_35, the wheels not)."""
    if ctx.torch is None or ctx.torch_cuda is None or not (ctx.pypi_default or ctx.torch.cuda is not None):
        return None
    return ctx.facts.wheel_arches(ctx.torch.version, ctx.torch_cuda)


def _arch_list_env(value: str | None, facts: Facts) -> str | None:
    """TORCH_CUDA_ARCH_LIST as torch's cpp_extension reads it: None where it picks the visible GPUs' arches
    itself (unset, "" or "native"), named arches ("Hopper") replaced by their numbers."""
    if value in (None, "", "native"):
        return None
    for name, arches in facts.torch_named_arches:
        value = value.replace(name, arches)
    return value


def _driver(ctx: Context) -> DriverVersion | None:
    """The driver; one given as the CUDA version it reports ("11040") becomes that CUDA's own driver,
    the lowest that reports it."""
    driver = _read(ctx, "driver", ctx.combo.driver, parse_driver)
    if driver is None or driver.reports_cuda is None:
        return driver
    lowest = ctx.facts.toolkit_driver(driver.reports_cuda.release)
    if lowest is None:
        ctx.problems.append(Finding("cuda-unknown", Severity.WARNING,
                                    f"{driver}: CUDA {driver.reports_cuda} is not in gptforge's tables; "
                                    "the driver rules were skipped", "give the driver version nvidia-smi prints"))
    return lowest


def _wheels(ctx: Context) -> None:
    """Read the wheels; a wheel's version stands for its project's when the combination gives none."""
    builds = [w if isinstance(w, WheelBuild) else _read(ctx, "wheel", w, read_wheel) for w in ctx.combo.wheels or ()]
    ctx.wheels = tuple(b for b in builds if b is not None)
    for build in ctx.wheels:
        field_name = PROJECT_FIELDS.get(build.project)
        if field_name and getattr(ctx, field_name) is None:
            setattr(ctx, field_name, build.version)
            ctx.prebuilt |= {field_name}


def build_context(combo: Combination, facts: Facts) -> Context:
    ctx = Context(combo, facts)
    ctx.driver = _driver(ctx)
    ctx.ccs = tuple(sorted(set(combo.ccs or ())))
    ctx.nvcc = _read(ctx, "cuda", combo.cuda, parse_cuda)
    ctx.torch = _read(ctx, "torch", combo.torch, parse_torch)
    ctx.torch_cuda = _read(ctx, "torch_cuda", combo.torch_cuda, parse_cuda)
    if ctx.torch and ctx.torch.cuda:
        if ctx.torch_cuda and ctx.torch_cuda.release != ctx.torch.cuda.release:
            ctx.problems.append(Finding(
                "torch-cuda-conflict", Severity.WARNING,
                f"torch {ctx.torch} is a CUDA {ctx.torch.cuda} build but torch_cuda says {ctx.torch_cuda}; "
                f"using {ctx.torch.cuda}", "drop one of the two, they must agree"))
        ctx.torch_cuda = ctx.torch.cuda
    if ctx.torch and ctx.torch_cuda is None and ctx.torch.local is None and ctx.nvcc is None:
        # an untagged version is the wheel `pip install torch==X` takes from PyPI; beside a CUDA toolkit it may as
        # well be a conda or locally built torch for that toolkit, so it stays unknown there
        ctx.torch_cuda = facts.pypi_default_cuda(ctx.torch.version)
        ctx.pypi_default = ctx.torch_cuda is not None
    if ctx.torch:
        ctx.torch_release = facts.torch_release(ctx.torch.release)
        if ctx.torch_release and ctx.torch_cuda:
            # a +cuXYZ tag is a download.pytorch.org wheel; an untagged version may be any build
            channel = "pypi" if ctx.torch.cuda or ctx.pypi_default else None
            ctx.torch_variant = ctx.torch_release.variant(ctx.torch_cuda, channel)
    _torch_arches(ctx)
    ctx.python = _read(ctx, "python", combo.python, parse_python)
    ctx.gcc = _read(ctx, "gcc", combo.gcc, parse_gcc)
    ctx.clang = _read(ctx, "clang", combo.clang, parse_clang)
    ctx.cudnn = _read(ctx, "cudnn", combo.cudnn, parse_cudnn)
    ctx.nccl = _read(ctx, "nccl", combo.nccl, parse_nccl)
    ctx.deepspeed = _read(ctx, "deepspeed", combo.deepspeed, lambda v: parse_release(v, "DeepSpeed"))
    ctx.transformer_engine = _read(ctx, "transformer_engine", combo.transformer_engine,
                                   lambda v: parse_release(v, "TransformerEngine"))
    ctx.flash_attn = _read(ctx, "flash_attn", combo.flash_attn, lambda v: parse_release(v, "flash-attn"))
    ctx.glibc = _read(ctx, "glibc", combo.glibc, parse_glibc)
    ctx.libstdcxx = _read(ctx, "libstdcxx", combo.libstdcxx, parse_glibcxx)
    ctx.torch_cudnn = _read(ctx, "torch_cudnn", combo.torch_cudnn, parse_cudnn)
    _wheels(ctx)
    ctx.arch_env = _read(ctx, "TORCH_CUDA_ARCH_LIST", _arch_list_env(combo.torch_cuda_arch_list_env, facts),
                         parse_arch_list)
    return ctx
