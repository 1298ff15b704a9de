"""NCCL against the torch that loads it. From 2.0 torch's wheels link libnccl.so.2 dynamically and pin the
nvidia-nccl-cuXX their build was compiled against (METADATA, read into torch_pypi_builds.toml and torch.toml); an
older NCCL found first at run time lacks the functions later releases added, and importing torch fails with
'libtorch_cuda.so: undefined symbol: ncclCommRegister' (pytorch/pytorch#119072) or 'ncclMemFree'
(rwth-i6/returnn#1802)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from packaging.version import Version

from gptforge.compat.context import Context
from gptforge.compat.facts import load_table
from gptforge.compat.findings import Finding, Severity

E, W = Severity.ERROR, Severity.WARNING


@cache
def _pypi_nccl_pins() -> tuple[tuple[Version, Version], ...]:
    """(torch version, the NCCL its PyPI wheel pins), oldest torch first."""
    rows = load_table("torch_pypi_builds.toml")["wheel"]
    return tuple(sorted((Version(row["version"]), Version(row["nccl"])) for row in rows if "nccl" in row))


def _links_nccl_dynamically(release: str) -> bool:
    """The release's PyPI wheels pin an NCCL wheel: they load libnccl.so.2 at run time instead of carrying it."""
    return any(f"{torch.major}.{torch.minor}" == release for torch, _ in _pypi_nccl_pins())


def _newest_torch_for(nccl: Version) -> tuple[Version, Version] | None:
    fitting = [(torch, pin) for torch, pin in _pypi_nccl_pins() if pin.release[:2] <= nccl.release[:2]]
    return fitting[-1] if fitting else None


def rule_nccl_vs_torch(ctx: Context, suggest: bool) -> Iterator[Finding]:
    variant = ctx.torch_variant
    # a +cuXYZ wheel or PyPI's own; an untagged torch beside a toolkit may be a conda build, linked to conda's NCCL
    is_wheel = ctx.torch is not None and (ctx.torch.cuda is not None or ctx.pypi_default)
    if ctx.nccl is None or not is_wheel or variant is None or variant.nccl is None or variant.channel != "pypi" \
            or not _links_nccl_dynamically(ctx.torch_release.release):
        return
    have, want = ctx.nccl, variant.nccl
    if have >= want:
        return
    package = f"nvidia-nccl-cu{variant.cuda.major}=={want}"
    if have.release[:2] < want.release[:2]:
        older = _newest_torch_for(have)
        downgrade = f"; or use torch {older[0]} (its wheel pins NCCL {older[1]})" if older else ""
        # untagged, the build is PyPI's only by assumption (conda's links conda's NCCL): a warning, so that leaving
        # out a fact (--torch-cuda, --cuda) never adds an error
        severity = E if ctx.torch.cuda is not None else W
        yield Finding("nccl-too-old-for-torch", severity,
                      f"torch {ctx.torch} is built against NCCL {want} (its wheel pins {package}) but NCCL {have} is "
                      "loaded: it lacks functions torch calls ('libtorch_cuda.so: undefined symbol: nccl...')",
                      f"let torch load its own NCCL: pip install {package} and remove the older libnccl.so.2 from "
                      f"LD_LIBRARY_PATH (or the other nvidia-nccl-cu* package){downgrade}")
    else:
        yield Finding("nccl-too-old-for-torch", W,
                      f"torch {ctx.torch} pins NCCL {want} ({package}); the older NCCL {have} is loaded",
                      f"pip install {package}")


RULES = (rule_nccl_vs_torch,)
