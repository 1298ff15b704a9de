"""Prebuilt extension wheels against the combination: the torch, CUDA major, C++ ABI and Python they
were built for (compat/wheels.py reads them; torch's ABI per release is data/torch_abi.toml), and the torch build
flash-attn's release workflow compiled each of its wheels against (data/flash_attn_wheels.toml)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptforge.compat.context import Context
from gptforge.compat.facts import load_table, release_row
from gptforge.compat.findings import Finding, Severity, no_data
from gptforge.compat.rule_helpers import join_fixes
from gptforge.compat.wheels import WheelBuild
from gptforge.core.versions import TorchVersion, parse_torch

E = Severity.ERROR
_UNDEFINED = "'ImportError: ... undefined symbol' at import"


def is_source_build(torch: TorchVersion) -> bool:
    """A torch built from a checkout between releases (NGC's 2.3.0a0+40ec155e58.nv24.3): a pre-release with a
    local tag that names no published build."""
    local = torch.local or ""
    return bool(local) and torch.version.is_prerelease and not local.startswith(("cu", "cpu", "rocm"))


@cache
def flash_attn_releases() -> dict[str, dict]:
    return {row["version"]: row for row in load_table("flash_attn_wheels.toml")["release"]}


def _published_abi_row(version: Version, cuda: str | None) -> dict | None:
    """The torch_abi.toml row of a PyPI / download.pytorch.org torch build (its release and CUDA)."""
    rows = [row for row in load_table("torch_abi.toml")["abi"] if row.get("cuda", cuda) == cuda]
    return release_row(rows, version)


def torch_abi_row(ctx: Context) -> dict | None:
    """The torch_abi.toml row of the combination's torch: PyPI / download.pytorch.org builds per release and
    CUDA, or source builds such as NGC's (None: unknown, e.g. conda builds)."""
    if ctx.torch is None or (ctx.torch_variant is not None and ctx.torch_variant.channel != "pypi"):
        return None
    if is_source_build(ctx.torch):
        return load_table("torch_abi.toml")["source_build"]
    return _published_abi_row(ctx.torch.version, str(ctx.torch_cuda.release) if ctx.torch_cuda else None)


def torch_cxx11_abi(ctx: Context) -> bool | None:
    """torch._C._GLIBCXX_USE_CXX11_ABI of the combination's torch (None: unknown)."""
    row = torch_abi_row(ctx)
    return None if row is None else row["cxx11_abi"]


def symbol_changes(built: tuple[int, int], have: tuple[int, int]) -> list[dict]:
    """The C++ symbol changes of the torch releases after the one a wheel was built for, up to the one it runs on."""
    return [row for row in load_table("torch_abi.toml")["symbol_change"]
            if built < tuple(int(p) for p in row["release"].split(".")) <= have]


def _torch(ctx: Context, build: WheelBuild) -> Iterator[Finding]:
    have = ctx.torch.version
    minor = (have.major, have.minor)
    if build.torch and build.torch != minor:
        built = f"{build.torch[0]}.{build.torch[1]}"
        fix = (f"install the {build.project} wheel built for torch {have.major}.{have.minor} "
               f"(torch{have.major}.{have.minor} in its name), or build it from source against this torch")
        changed = symbol_changes(build.torch, minor)
        if build.torch > minor or changed:
            why = (f"torch {changed[0]['release']} changed a C++ symbol it calls ({changed[0]['symbol']})" if changed
                   else "it may call C++ symbols this older torch lacks")
            yield Finding("wheel-torch-mismatch", E,
                          f"{build.origin} was built for torch {built}, not torch {have}: {why}: {_UNDEFINED}", fix)
        else:
            yield Finding("wheel-torch-mismatch", Severity.WARNING,
                          f"{build.origin} was built for torch {built}, not torch {have}: it loads only while the "
                          f"C++ symbols it calls are unchanged since torch {built} (no change recorded): otherwise "
                          f"{_UNDEFINED}", fix)
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


@cache
def _torch_builds(version: str) -> tuple[TorchVersion, ...]:
    """The torch builds a flash-attn release's workflow compiled its wheels against, parsed once per process."""
    return tuple(parse_torch(b) for b in flash_attn_releases()[version].get("torch_builds", ()))


def _built_against(release: dict, minor: tuple[int, int], cuda_major: int | None) -> list[TorchVersion]:
    """The torch builds a flash-attn release's workflow compiled its wheels for this torch minor (and CUDA major)
    against."""
    return [b for b in _torch_builds(release["version"]) if (b.version.major, b.version.minor) == minor
            and (cuda_major is None or b.cuda.major == cuda_major)]


def _build_abi(build: TorchVersion) -> bool | None:
    row = _published_abi_row(build.version, str(build.cuda.release))
    return None if row is None else row["cxx11_abi"]


def _nightly(builds: list[TorchVersion], torch: TorchVersion) -> bool:
    """Compiled against a nightly of the torch release given: its C++ symbols may differ from the release's
    (flash-attn 2.5.7's torch 2.3 wheel fails on 2.3.0, flash-attention#931; 2.6.0's torch 2.4 wheel runs on 2.4.0,
    flash-attention#975), so this is a warning."""
    return bool(builds) and all(b.version.is_prerelease for b in builds) and not torch.version.is_prerelease


def _flaws(builds: list[TorchVersion], label_abi: bool | None, torch_abi: bool | None) -> list[str]:
    """Why the wheel compiled against these builds fails with this torch: labelled pre-C++11 ABI yet compiled against
    a torch build of the C++11 ABI (the label's flag does not override torch's own)."""
    if label_abi is False and torch_abi is False and builds and all(_build_abi(b) for b in builds):
        return [f"is labelled cxx11abiFALSE but was compiled against torch {builds[0]}, a C++11-ABI build, so it "
                "needs the C++11 ABI: 'undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx11...'"]
    return []


def _sound_release(minor: tuple[int, int], cuda_major: int | None, torch: TorchVersion, torch_abi: bool | None,
                   current: Version, python: str | None = None) -> Version | None:
    """The flash-attn release nearest to the current one (newer first) whose wheel for this torch (and Python) has no
    flaw."""
    sound = [Version(v) for v, row in flash_attn_releases().items()
             if (builds := _built_against(row, minor, cuda_major)) and not _flaws(builds, torch_abi, torch_abi)
             and not _nightly(builds, torch) and python in (None, *row["python"])]
    newer = sorted(v for v in sound if v > current)
    older = sorted((v for v in sound if v < current), reverse=True)
    return (newer or older or [None])[0]


def rule_flash_attn_wheel_build(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """The flash-attn wheel for this torch: a --wheel, or the one its setup.py downloads for --flash-attn (named for
    torch's minor, CUDA major and C++ ABI), judged by the torch build its release workflow compiled it against."""
    if ctx.torch is None or is_source_build(ctx.torch):
        return
    torch_abi = torch_cxx11_abi(ctx)
    cuda_major = ctx.torch_cuda.major if ctx.torch_cuda else None
    wheels = [(w.version, w.torch, w.cxx11_abi, w.cuda_major or cuda_major, w.origin)
              for w in ctx.wheels if w.project == "flash-attn" and w.torch]
    python = f"{ctx.python.major}.{ctx.python.minor}" if ctx.python else None
    given = flash_attn_releases().get(ctx.flash_attn.public) if ctx.flash_attn else None
    if given and "flash_attn" not in ctx.prebuilt and python in (None, *given["python"]):
        wheels.append((ctx.flash_attn, (ctx.torch.version.major, ctx.torch.version.minor), torch_abi, cuda_major,
                       f"the prebuilt wheel pip install flash-attn=={ctx.flash_attn} downloads for torch "
                       f"{ctx.torch.release}"))
    for version, minor, label_abi, major, origin in wheels:
        release = flash_attn_releases().get(version.public)
        if release is None or minor != (ctx.torch.version.major, ctx.torch.version.minor):
            continue
        builds = _built_against(release, minor, major)
        other = _sound_release(minor, major, ctx.torch, torch_abi, version)
        fix = join_fixes(f"pip install flash-attn=={other} (its wheel for torch {ctx.torch.release} was compiled "
                         "against a released torch of this ABI)" if other else None,
                         "build flash-attn from source against this torch (pip install --no-build-isolation "
                         "--no-binary flash-attn flash-attn)")
        for flaw in _flaws(builds, label_abi, torch_abi):
            yield Finding("wheel-abi-mismatch", E, f"{origin} {flaw}", fix)
        if _nightly(builds, ctx.torch):
            yield Finding("wheel-built-against-nightly", Severity.WARNING,
                          f"{origin} was compiled against torch {builds[0].version}, a nightly before the "
                          f"{ctx.torch.version.base_version} release, whose C++ symbols may differ: {_UNDEFINED}", fix)


def rule_flash_attn_source_build(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """pip install flash-attn==X downloads the release's wheel named for torch's minor, CUDA major, C++ ABI and Python
    (its setup.py); with none for this torch it compiles flash-attn from source against it."""
    release = flash_attn_releases().get(ctx.flash_attn.public) if ctx.flash_attn else None
    if release is None or ctx.torch is None or ctx.torch_is_cpu or "flash_attn" in ctx.prebuilt \
            or is_source_build(ctx.torch):
        return
    minor = (ctx.torch.version.major, ctx.torch.version.minor)
    cuda_major = ctx.torch_cuda.major if ctx.torch_cuda else None
    python = f"{ctx.python.major}.{ctx.python.minor}" if ctx.python else None
    have = {"torch": f"{minor[0]}.{minor[1]}", "cuda_major": None if cuda_major is None else str(cuda_major),
            "python": python}
    missing = [key for key, value in have.items() if value is not None and value not in release[key]]
    if not missing and not _built_against(release, minor, cuda_major):
        missing = ["torch"]  # the workflow's job for this torch and CUDA installs no torch build: it makes no wheel
    if not missing:
        return
    other = _sound_release(minor, cuda_major, ctx.torch, torch_cxx11_abi(ctx), ctx.flash_attn, python)
    names = {"torch": "torch", "cuda_major": "CUDA", "python": "Python"}
    span = "; ".join(f"{names[key]} {', '.join(release[key])}" for key in missing)
    nvcc = f"nvcc {ctx.torch_cuda.release}" if ctx.torch_cuda else "the nvcc of torch's CUDA"
    yield Finding("flash-attn-source-build", Severity.WARNING,
                  f"flash-attn {ctx.flash_attn} has no prebuilt wheel for torch {ctx.torch}"
                  + "".join(f", {names[key]} {have[key]}" for key in missing if key != "torch")
                  + f" (its wheels: {span}): pip compiles it from source against this torch with {nvcc}, which "
                  "takes long and fails where the release's code does not build against this torch ('Error compiling "
                  "objects for extension')",
                  join_fixes(f"pip install flash-attn=={other} (it has a wheel for this torch)" if other else None,
                             f"build it with {nvcc} and --no-build-isolation"))


def rule_wheels(ctx: Context, suggest: bool) -> Iterator[Finding]:
    for build in ctx.wheels:
        if ctx.torch:
            yield from _torch(ctx, build)
            yield from _abi(ctx, build)
        yield from _cuda(ctx, build)
        if ctx.python:
            yield from _python(ctx, build)
