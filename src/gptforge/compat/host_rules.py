"""What published wheels need from the host: glibc (their manylinux tag, or the runner they were built on),
libstdc++ (the GLIBCXX of the gcc that built an extension), the gcc torch's headers compile with, and the Pythons a
TransformerEngine release accepts. Facts: data/host_libs.toml, torch_python.toml, torch_abi.toml, torch.toml,
flash_attn_wheels.toml, te_wheels.toml.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptforge.compat.context import Context
from gptforge.compat.facts import load_table
from gptforge.compat.findings import Finding, Severity
from gptforge.compat.host_libs import build_os_glibc, gcc_glibcxx, manylinux_glibc
from gptforge.compat.wheel_rules import flash_attn_releases, is_source_build, torch_abi_row
from gptforge.compat.wheels import WheelBuild

E, W = Severity.ERROR, Severity.WARNING


@cache
def _rows(table: str) -> dict[str, dict]:
    return {row["version"]: row for row in load_table(table)["release"]}


def _te_release(version: Version) -> dict | None:
    rows = _rows("te_wheels.toml")
    return rows.get(version.public) or rows.get(f"{version.major}.{version.minor}.0")


def _torch_glibc(ctx: Context) -> Version | None:
    """The glibc floor of the torch wheel: its build's ABI row, or what its PyPI wheels need (their manylinux tag, or
    the newest GLIBC_ version their shared objects need where that is newer)."""
    if ctx.torch is None or is_source_build(ctx.torch):
        return None
    if ctx.torch_variant is not None and ctx.torch_variant.channel != "pypi":
        return None
    row = torch_abi_row(ctx)
    if row and "glibc" in row:
        return Version(row["glibc"])
    return ctx.facts.torch_glibc.get(ctx.torch.version.public)


def _wheel_glibc(build: WheelBuild) -> tuple[Version, str] | None:
    """The glibc floor of a prebuilt wheel and where it comes from."""
    floors = [f for f in (manylinux_glibc(tag.platform) for tag in build.tags if tag.platform.endswith("x86_64")) if f]
    if floors:
        return min(floors), f"its {min(build.tags, key=lambda t: t.platform).platform} tag"
    release = flash_attn_releases().get(build.version.public) if build.project == "flash-attn" else None
    glibc = build_os_glibc(release["os"], "flash-attn") if release else None
    return (glibc, f"flash-attn {build.version.public}'s wheels are built on {release['os']}") if glibc else None


def _flash_attn_glibc(ctx: Context) -> tuple[Version, str] | None:
    """pip takes flash-attn's prebuilt wheel when its release builds one for this torch minor (and Python)."""
    release = flash_attn_releases().get(ctx.flash_attn.public) if ctx.flash_attn else None
    if release is None or ctx.torch is None or "flash_attn" in ctx.prebuilt:
        return None
    python = f"{ctx.python.major}.{ctx.python.minor}" if ctx.python else None
    if ctx.torch.release not in release["torch"] or (python and python not in release["python"]):
        return None
    glibc = build_os_glibc(release["os"], "flash-attn")
    return (glibc, f"flash-attn {ctx.flash_attn}'s prebuilt wheel for torch {ctx.torch.release} is built on "
                   f"{release['os']}") if glibc else None


def _needs(ctx: Context) -> Iterator[tuple[str, Version, str]]:
    """(what, glibc floor, why) for each published binary of the combination."""
    if floor := _torch_glibc(ctx):
        yield f"torch {ctx.torch}", floor, "its wheels' manylinux tag, or the GLIBC_ versions their libraries need"
    for build in ctx.wheels:
        if found := _wheel_glibc(build):
            yield build.origin, *found
    if found := _flash_attn_glibc(ctx):
        yield f"flash-attn {ctx.flash_attn}", *found
    te = _te_release(ctx.transformer_engine) if ctx.transformer_engine else None
    if te and "glibc" in te and "transformer_engine" not in ctx.prebuilt:
        yield f"TransformerEngine {ctx.transformer_engine}", Version(te["glibc"]), "its core wheel's manylinux tag"


def rule_glibc(ctx: Context, suggest: bool) -> Iterator[Finding]:
    if ctx.glibc is None:
        return
    for what, floor, why in _needs(ctx):
        if ctx.glibc < floor:
            yield Finding("glibc-too-old", E,
                          f"{what} needs glibc >= {floor} ({why}); this host has glibc {ctx.glibc}: pip finds no "
                          f"matching wheel, or the import fails with \"version `GLIBC_{floor}' not found\"",
                          f"use a host or container with glibc >= {floor} (e.g. a newer Linux distribution), or an "
                          f"older release built for glibc {ctx.glibc}, or build it from source on this host")


def rule_libstdcxx(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """An extension built by this gcc uses its libstdc++'s symbol versions; an older loaded libstdc++ lacks them."""
    if ctx.libstdcxx is None or ctx.gcc is None:
        return
    need = gcc_glibcxx(ctx.gcc)
    if need and ctx.libstdcxx < need:
        yield Finding("libstdcxx-too-old", E,
                      f"extensions built by gcc {ctx.gcc} need GLIBCXX_{need}; the loaded libstdc++ provides up to "
                      f"GLIBCXX_{ctx.libstdcxx}: \"version `GLIBCXX_{need}' not found\" at import",
                      f"load a libstdc++ from gcc >= {ctx.gcc.major} (conda install -c conda-forge "
                      f"'libstdcxx-ng>={ctx.gcc.major}', or put the system one first: LD_PRELOAD=/usr/lib/x86_64-linux-"
                      "gnu/libstdc++.so.6), or build with the gcc that matches the loaded libstdc++")


def rule_torch_headers_gcc(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """torch releases whose C++ headers an old gcc cannot compile as nvcc's host compiler (torch.toml's
    header_gcc_bug). A version without its patch is every published patch of it: an error only when each has the bug."""
    if ctx.torch is None or ctx.gcc is None or ctx.nvcc is None or ctx.torch_is_cpu:
        return
    version = ctx.torch.version
    patches = [Version(version.public)] if len(version.release) >= 3 else sorted(
        v for v in map(Version, ctx.facts.torch_python)
        if not v.is_prerelease and (v.major, v.minor) == (version.major, version.minor)) or [version]
    for row in load_table("torch.toml").get("header_gcc_bug", []):
        spec = SpecifierSet(row["versions"])
        hit = [patch for patch in patches if spec.contains(patch, prereleases=True)]
        if ctx.gcc.major > row["gcc_max"] or not hit:
            continue
        which = f"torch {ctx.torch}" if len(hit) == len(patches) else f"torch {', '.join(map(str, hit))}"
        yield Finding("torch-headers-gcc", E if len(hit) == len(patches) else W,
                      f"{which}'s C++ headers do not compile with gcc {ctx.gcc} as nvcc's host compiler: every .cu "
                      f"file that includes torch/extension.h stops with \"{row['error']}\"",
                      f"use gcc >= {row['gcc_max'] + 1} for nvcc (CUDAHOSTCXX=g++-7 or nvcc -ccbin g++-7), or a torch "
                      f"release outside {spec}")


def rule_te_python(ctx: Context, suggest: bool) -> Iterator[Finding]:
    """A TransformerEngine release's packages accept only the Pythons of their Requires-Python."""
    te = _te_release(ctx.transformer_engine) if ctx.transformer_engine and ctx.python else None
    if te is None or "requires_python" not in te:
        return
    python = Version(f"{ctx.python.major}.{ctx.python.minor}")
    spec = SpecifierSet(te["requires_python"])
    if not spec.contains(python):
        yield Finding("te-unsupported", E,
                      f"TransformerEngine {ctx.transformer_engine} requires Python {spec}, not {ctx.python}: pip "
                      "finds no version that satisfies it ('requires a different Python')",
                      f"use a Python in {spec}, or a TransformerEngine release that supports Python {ctx.python}")


RULES = (rule_glibc, rule_libstdcxx, rule_torch_headers_gcc, rule_te_python)
