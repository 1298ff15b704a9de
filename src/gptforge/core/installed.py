"""Whether a module imports, where the CuTe DSL is installed, and whether it counts as installed code for quack's
kernel cache.

The DSL (nvidia-cutlass-dsl) is what FA4's and quack's kernels are written in; the trainer asks before
turning quack's GEMMs on, the doctor reports it.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

DSL_PACKAGE = "nvidia_cutlass_dsl"


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
