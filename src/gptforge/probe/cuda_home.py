"""The layout of the CUDA root that builds will use: lib64, headers, the toolkit's libcudart; and
which directory of an environment prefix is its CUDA_HOME, whatever the layout."""

from __future__ import annotations

import glob
import os
import re

from gptforge.core import TARGET_DIR
from gptforge.errors import GptforgeError

from gptforge.probe.cudart import describe_libcudart
from gptforge.probe.nvcc import cuda_home_setting


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


# NVIDIA's CUDA 13+ wheels install one toolkit tree per major: site-packages/nvidia/cu13/{bin,include,lib}
_WHEEL_ROOTS = os.path.join("lib", "python3*", "site-packages", "nvidia", "cu[0-9]*")


def find_cuda_home(prefix: str) -> tuple[str, str]:
    """(CUDA_HOME, layout) for an environment prefix: "conda" (conda-forge's targets/x86_64-linux;
    CUDA_HOME is the prefix itself, which fix-links makes complete), "toolkit" (include/cuda_runtime.h
    or bin/nvcc in the prefix: a plain toolkit, or a wheel root given directly) or "wheels" (the
    nvidia/cuXY root in site-packages; with several, the newest major that has nvcc, else the newest)."""
    targets = os.path.isdir(os.path.join(prefix, TARGET_DIR))
    toolkit = any(os.path.isfile(os.path.join(prefix, *p)) for p in (("include", "cuda_runtime.h"), ("bin", "nvcc")))
    if targets and (os.path.isdir(os.path.join(prefix, "conda-meta")) or not toolkit):
        return prefix, "conda"
    if toolkit:
        return prefix, "toolkit"
    roots = [r for r in glob.glob(os.path.join(prefix, _WHEEL_ROOTS))
             if re.fullmatch(r"cu\d+", os.path.basename(r)) and os.path.isfile(os.path.join(r, "include", "cuda_runtime.h"))]
    if roots:
        return max(roots, key=_wheel_root_rank), "wheels"
    raise GptforgeError(f"no CUDA toolkit in {prefix}: no {TARGET_DIR}, no include/cuda_runtime.h or bin/nvcc, "
                        "no site-packages/nvidia/cuXY with include/cuda_runtime.h",
                        "install the CUDA packages (conda: cuda-nvcc, cuda-cudart-dev; pip: nvidia-cuda-runtime, "
                        "nvidia-cuda-nvcc) or pass --prefix")


def _wheel_root_rank(root: str) -> tuple:
    """Prefer a tree with nvcc (a build needs it), then the newest major."""
    return os.path.isfile(os.path.join(root, "bin", "nvcc")), int(os.path.basename(root)[2:]), root
