"""The CUDA runtime library: which files the process has mapped, and what version each one is.

``cudaRuntimeGetVersion`` answers without a GPU or a driver, so this works on any machine.
"""

from __future__ import annotations

import ctypes
import os

from gptforge.core.versions import CudaVersion


def runtime_version(path: str) -> int | None:
    """``cudaRuntimeGetVersion`` of the libcudart at ``path`` (e.g. 13000), None if it cannot load."""
    try:
        lib = ctypes.CDLL(path)
        version = ctypes.c_int(0)
        status = lib.cudaRuntimeGetVersion(ctypes.byref(version))
    except (OSError, AttributeError):
        return None
    return version.value if status == 0 else None


def format_runtime_version(encoded: int | None) -> str | None:
    """13000 -> "13.0", 12080 -> "12.8" (CUDA's major*1000 + minor*10 encoding)."""
    if encoded is None:
        return None
    return str(CudaVersion.from_encoded(encoded))


def mapped_libcudart(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of every libcudart*.so* mapped into this process, in first-seen order."""
    return mapped_libraries("libcudart", maps_path)


def mapped_libraries(prefix: str, maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of every shared library whose name starts with ``prefix`` mapped into this process, first-seen order."""
    try:
        with open(maps_path, errors="replace") as maps:  # a mapped file's path need not be UTF-8
            lines = maps.read().splitlines()
    except OSError:
        return []
    seen: list[str] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            name = os.path.basename(path)
            if name.startswith(prefix) and ".so" in name and path not in seen:
                seen.append(path)
    return seen


def describe_libcudart(path: str) -> dict:
    """A libcudart file: its real path and its runtime version, encoded and as "X.Y"."""
    encoded = runtime_version(path)
    return {
        "path": path,
        "real_path": os.path.realpath(path),
        "version": format_runtime_version(encoded),
        "encoded_version": encoded,
    }


def probe_loaded_libcudart(maps_path: str = "/proc/self/maps") -> list[dict]:
    """Each mapped libcudart with its real path and runtime version (call after importing torch)."""
    return [describe_libcudart(path) for path in mapped_libcudart(maps_path)]
