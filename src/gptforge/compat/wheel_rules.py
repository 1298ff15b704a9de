"""Prebuilt extension wheels against the combination: the torch, CUDA major, C++ ABI and Python they
were built for (compat/wheels.py reads them; torch's ABI per release is data/torch_abi.toml)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from packaging.specifiers import SpecifierSet

from gptforge.compat.context import Context
from gptforge.compat.facts import load_table, release_row
from gptforge.compat.findings import Finding, Severity, no_data
from gptforge.compat.wheels import WheelBuild
from gptforge.core.versions import TorchVersion

E = Severity.ERROR
_UNDEFINED = "'ImportError: ... undefined symbol' at import"


@cache
def _abi_table() -> dict:
    return load_table("torch_abi.toml")


def is_source_build(torch: TorchVersion) -> bool:
    """A torch built from a checkout between releases (NGC's 2.3.0a0+40ec155e58.nv24.3): a pre-release with a
    local tag that names no published build."""
    local = torch.local or ""
    return bool(local) and torch.version.is_prerelease and not local.startswith(("cu", "cpu", "rocm"))


def torch_abi_row(ctx: Context) -> dict | None:
    """The torch_abi.toml row of the combination's torch: PyPI / download.pytorch.org builds per release and
    CUDA, or source builds such as NGC's (None: unknown, e.g. conda builds)."""
    if ctx.torch is None or (ctx.torch_variant is not None and ctx.torch_variant.channel != "pypi"):
        return None
    if is_source_build(ctx.torch):
        return _abi_table()["source_build"]
    cuda = str(ctx.torch_cuda.release) if ctx.torch_cuda else None
    rows = [row for row in _abi_table()["abi"] if row.get("cuda", cuda) == cuda]
    return release_row(rows, ctx.torch.version)


def torch_cxx11_abi(ctx: Context) -> bool | None:
    """torch._C._GLIBCXX_USE_CXX11_ABI of the combination's torch (None: unknown)."""
    row = torch_abi_row(ctx)
    return None if row is None else row["cxx11_abi"]


def _torch(ctx: Context, build: WheelBuild) -> Iterator[Finding]:
    have = ctx.torch.version
    if build.torch and build.torch != (have.major, have.minor):
        built = f"{build.torch[0]}.{build.torch[1]}"
        yield Finding("wheel-torch-mismatch", E,
                      f"{build.origin} was built for torch {built}, not torch {have}: {_UNDEFINED}",
                      f"install the {build.project} wheel built for torch {have.major}.{have.minor} "
                      f"(torch{have.major}.{have.minor} in its name), or build it from source against this torch")
    elif build.torch and is_source_build(ctx.torch):
        yield Finding("wheel-torch-mismatch", E,
                      f"{build.origin} was built against a released torch {build.torch[0]}.{build.torch[1]}, not the "
                      f"source build torch {ctx.torch} (e.g. an NGC container's): {_UNDEFINED}",
                      f"build {build.project} from source against this torch (pip install --no-build-isolation "
                      f"--no-binary {build.project} {build.project}), or use a released torch")
    elif build.torch_pin and not SpecifierSet(build.torch_pin).contains(have.public, prereleases=True):
        yield Finding("wheel-torch-mismatch", E,
                      f"{build.origin} requires torch{build.torch_pin}, not torch {have}",
                      f"install torch{build.torch_pin}, or the {build.project} build for torch {have}")


def _cuda(ctx: Context, build: WheelBuild) -> Iterator[Finding]:
    if build.cuda_major and ctx.torch_cuda and build.cuda_major != ctx.torch_cuda.major:
        yield Finding("wheel-cuda-mismatch", E,
                      f"{build.origin} was built for CUDA {build.cuda_major}, torch for CUDA {ctx.torch_cuda}: "
                      f"{_UNDEFINED} or 'libcudart.so.{build.cuda_major}: cannot open shared object file'",
                      f"install the {build.project} wheel built for CUDA {ctx.torch_cuda.major} "
                      f"(cu{ctx.torch_cuda.major} in its name)")


def _abi(ctx: Context, build: WheelBuild) -> Iterator[Finding]:
    if build.cxx11_abi is None:
        return
    have = torch_cxx11_abi(ctx)
    wanted = "TRUE" if have else "FALSE"
    if have is None:
        yield no_data(f"the C++ ABI of torch {ctx.torch} (the wheel {build.origin} needs "
                      f"cxx11abi{'TRUE' if build.cxx11_abi else 'FALSE'})",
                      "compare with python -c 'import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)'")
    elif have != build.cxx11_abi:
        yield Finding("wheel-abi-mismatch", E,
                      f"{build.origin} was built for the other C++ ABI than torch {ctx.torch} "
                      f"(torch._C._GLIBCXX_USE_CXX11_ABI is {have}): 'undefined symbol: "
                      "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx11...'",
                      f"install the {build.project} wheel with cxx11abi{wanted} in its name")


def _python(ctx: Context, build: WheelBuild) -> Iterator[Finding]:
    interpreters = {tag.interpreter for tag in build.tags}
    want = f"cp{ctx.python.major}{ctx.python.minor}"
    if interpreters and want not in interpreters and not any(i.startswith("py3") for i in interpreters):
        yield Finding("wheel-python-mismatch", E,
                      f"{build.origin} is for {', '.join(sorted(interpreters))}, not Python {ctx.python}: "
                      "'is not a supported wheel on this platform'",
                      f"install the {build.project} wheel with {want} in its name")


def rule_wheels(ctx: Context, suggest: bool) -> Iterator[Finding]:
    for build in ctx.wheels:
        if ctx.torch:
            yield from _torch(ctx, build)
            yield from _abi(ctx, build)
        yield from _cuda(ctx, build)
        if ctx.python:
            yield from _python(ctx, build)
