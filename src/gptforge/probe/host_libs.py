"""The host's C and C++ runtimes: the glibc this process runs on, and the newest GLIBCXX symbol version of
the libstdc++ it loaded (read from the library's bytes: nothing in it is run)."""

from __future__ import annotations

import os
import platform
import re
import sys

from gptforge.probe.cudart import mapped_libraries

_GLIBCXX = re.compile(rb"GLIBCXX_(3\.4(?:\.\d{1,2})?)\x00")
_MAX_BYTES = 64 << 20  # libstdc++.so is a few MB; never read more than this
# Where the loader finds libstdc++ when the process has not loaded it yet: the environment's own lib folder
# (conda), then the distributions' library folders.
_SEARCH = ("lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu", "/lib64", "/usr/lib")


def glibc_version() -> str | None:
    """'2.35': os.confstr('CS_GNU_LIBC_VERSION') ('glibc 2.35'), else platform.libc_ver()."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        found = ""
    name, _, version = found.partition(" ")
    if name == "glibc" and version:
        return version
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def glibcxx_versions(path: str) -> list[str]:
    """The GLIBCXX_3.4.N symbol versions a libstdc++ file defines, oldest first."""
    try:
        with open(path, "rb") as lib:
            data = lib.read(_MAX_BYTES)
    except OSError:
        return []
    found = {match.decode() for match in _GLIBCXX.findall(data)}
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def _libstdcxx_path() -> str | None:
    mapped = mapped_libraries("libstdc++")
    if mapped:
        return mapped[0]
    for folder in _SEARCH:
        path = os.path.join(sys.prefix, folder) if not folder.startswith("/") else folder
        candidate = os.path.join(path, "libstdc++.so.6")
        if os.path.isfile(candidate):
            return candidate
    return None


def probe_host() -> dict:
    """glibc, and the libstdc++ this process loaded (or the one the loader would take) with its newest GLIBCXX."""
    path = _libstdcxx_path()
    versions = glibcxx_versions(path) if path else []
    return {"glibc": glibc_version(), "libstdcxx_path": os.path.realpath(path) if path else None,
            "libstdcxx": versions[-1] if versions else None}
