"""The host's C and C++ runtimes as versions: glibc (2.31), the GLIBCXX symbol versions of libstdc++
(3.4.30), the glibc floor a wheel's platform tag names, and the GLIBCXX a GCC's libstdc++ provides
(data/host_libs.toml)."""

from __future__ import annotations

import re

from packaging.version import Version

from gptforge.compat.facts import load_table
from gptforge.core.versions import VersionError

_GLIBC = re.compile(r"^(?:glibc[ _-]?)?(\d)\.(\d{1,2})$", re.ASCII | re.IGNORECASE)
_GLIBCXX = re.compile(r"^(?:GLIBCXX_)?(3)\.(4)\.(\d{1,2})$", re.ASCII | re.IGNORECASE)
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")


def parse_glibc(text: str) -> Version:
    """'2.31' (ldd --version, platform.libc_ver()) or 'glibc 2.31'."""
    match = _GLIBC.match(str(text).strip())
    if not match:
        raise VersionError(f"{text!r} is not a glibc version (expected e.g. 2.31, as 'ldd --version' prints it)")
    return Version(f"{match.group(1)}.{match.group(2)}")


def parse_glibcxx(text: str) -> Version:
    """'3.4.30' or 'GLIBCXX_3.4.30': the newest GLIBCXX symbol version a libstdc++ provides."""
    match = _GLIBCXX.match(str(text).strip())
    if not match:
        raise VersionError(f"{text!r} is not a GLIBCXX version (expected e.g. 3.4.30 or GLIBCXX_3.4.30, the "
                           "highest one 'strings libstdc++.so.6 | grep GLIBCXX' lists)")
    return Version(".".join(match.groups()))


def manylinux_glibc(platform: str) -> Version | None:
    """The glibc a wheel's platform tag needs: manylinux_2_28_x86_64 -> 2.28, manylinux2014_x86_64 -> 2.17;
    None for a tag that names none (linux_x86_64, musllinux, other systems)."""
    if match := _MANYLINUX.match(platform):
        return Version(f"{match.group(1)}.{match.group(2)}")
    found = load_table("host_libs.toml")["manylinux"]["aliases"].get(platform.split("_")[0])
    return Version(found) if found else None


def gcc_glibcxx(gcc: Version) -> Version | None:
    """The newest GLIBCXX the libstdc++ of this gcc provides; a major alone counts as its first release."""
    release = (gcc.major, 1, 0) if len(gcc.release) == 1 else (gcc.release + (0, 0))[:3]
    rows = [(Version(r["gcc"]), Version(r["glibcxx"])) for r in load_table("host_libs.toml")["glibcxx"]]
    below = [glibcxx for built, glibcxx in rows if built.release <= release]
    return max(below) if below else None


def build_os_glibc(os_name: str, project: str | None = None) -> Version | None:
    """The glibc a wheel built on a CI runner image needs: what the project's wheels from there were seen to
    need, else the runner's own glibc ("ubuntu-20.04" -> 2.31)."""
    seen = [r for r in load_table("host_libs.toml").get("wheel_glibc", []) if r["project"] == project and r["os"] == os_name]
    rows = seen or [r for r in load_table("host_libs.toml")["build_os"] if r["os"] == os_name]
    return Version(rows[0]["glibc"]) if rows else None
