"""Whether a module imports, which distributions are installed (read safely), where the CuTe DSL is installed,
and whether it counts as installed code for quack's kernel cache.

The DSL (nvidia-cutlass-dsl) is what FA4's and quack's kernels are written in; the trainer asks before
turning quack's GEMMs on, the doctor reports it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import stat
from pathlib import Path

from gptforge.reading import MAX_BYTES

DSL_PACKAGE = "nvidia_cutlass_dsl"
READ_FILES = ("METADATA", "PKG-INFO", "direct_url.json")  # what gptforge reads of a dist-info or egg-info


def readable(dist: importlib.metadata.Distribution) -> bool:
    """Whether the files gptforge reads of DIST are regular files of a sane size: importlib.metadata reads them
    whole, so a FIFO named METADATA would block the read for ever and a device would flood it."""
    folder = getattr(dist, "_path", None)  # PathDistribution's own directory; other finders have none
    if not isinstance(folder, (str, os.PathLike)):
        return True
    for name in READ_FILES:
        try:
            info = os.stat(Path(folder) / name)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return False
    return True


def distributions() -> list[importlib.metadata.Distribution]:
    """The installed distributions whose metadata is safe to read (``readable``)."""
    return [dist for dist in importlib.metadata.distributions() if readable(dist)]


def installed_version(distribution: str) -> str | None:
    """DISTRIBUTION's installed version, or None when it is not installed or its metadata is not safe to read."""
    for dist in importlib.metadata.distributions(name=distribution):  # the one importlib.metadata.version reads
        return dist.version if readable(dist) else None
    return None


def import_error(module: str) -> str | None:
    """Why MODULE cannot be imported (the exception's first line), or None when it can."""
    try:
        importlib.import_module(module)
    except Exception as e:  # an installed-but-broken extension raises more than ImportError
        first = (str(e).splitlines() or [""])[0]
        return f"{type(e).__name__}: {first[:200]}"
    return None


def dsl_directory() -> str | None:
    """Where the CuTe DSL is installed (a namespace package: its first directory), without importing it."""
    spec = importlib.util.find_spec(DSL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def outside_site_packages(directory: str | None) -> str | None:
    """DIRECTORY when no site-packages or dist-packages directory holds it, else None.

    quack fingerprints each function its epilogues reach to key its kernel cache, and takes installed code
    (a path through site-packages or dist-packages) by name only; the DSL's functions found anywhere else,
    e.g. after ``pip install --target DIR`` with DIR on PYTHONPATH, are walked into, and their module-level
    loggers and context variables make it raise "... has no fail-closed semantic key".
    """
    if directory is None:
        return None
    return None if {"site-packages", "dist-packages"} & set(Path(directory).parts) else directory
