"""The layout of the CUDA root that builds will use: lib64, headers, the toolkit's libcudart."""

from __future__ import annotations

import glob
import os

from gptforge.probe.cudart import describe_libcudart
from gptforge.probe.nvcc import cuda_home_setting

TARGET_DIR = os.path.join("targets", "x86_64-linux")


def _kind(path: str) -> str | None:
    if os.path.islink(path):
        return "symlink" if os.path.exists(path) else "broken symlink"
    if os.path.isdir(path):
        return "dir"
    return None


def _toolkit_libcudart(home: str) -> dict | None:
    """libcudart.so (or the shortest libcudart name) under lib64/, lib/ or targets/*/lib, with its version."""
    for sub in ("lib64", "lib", os.path.join(TARGET_DIR, "lib")):
        names = sorted(glob.glob(os.path.join(home, sub, "libcudart.so*")), key=len)
        if names:
            return describe_libcudart(names[0])
    return None


def probe_cuda_home(env: dict | None = None) -> dict:
    """Which CUDA root is in effect, where it came from, and whether it has the usual layout."""
    env = dict(os.environ if env is None else env)
    path, source = cuda_home_setting(env)
    info = {
        "path": path, "source": source, "exists": False, "readable": False, "lib64": None, "lib": False,
        "cuda_runtime_h": None, "headers_only_in_targets": False, "libcudart": None,
    }
    if path is None or not os.path.isdir(path):
        return info
    info["exists"] = True
    info["readable"] = os.access(path, os.R_OK | os.X_OK)
    info["lib64"] = _kind(os.path.join(path, "lib64"))
    info["lib"] = os.path.isdir(os.path.join(path, "lib"))
    top = os.path.join(path, "include", "cuda_runtime.h")
    targets = os.path.join(path, TARGET_DIR, "include", "cuda_runtime.h")
    if os.path.isfile(top):
        info["cuda_runtime_h"] = top
    elif os.path.isfile(targets):
        info["cuda_runtime_h"] = targets
        info["headers_only_in_targets"] = True
    info["libcudart"] = _toolkit_libcudart(path)
    return info
