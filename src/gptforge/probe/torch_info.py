"""torch: version, the CUDA it was built with, its arch list, cuDNN, NCCL, and whether CUDA works.

Importing torch takes seconds and loads the CUDA runtime, so it is imported once, here.
"""

from __future__ import annotations

import importlib.util
import warnings

from gptforge.core.versions import parse_cudnn


def format_cudnn_version(encoded: int | None) -> str | None:
    """torch.backends.cudnn.version(): 91701 -> "9.17.1" (cuDNN 9+), 8902 -> "8.9.2" (cuDNN 8)."""
    return str(parse_cudnn(str(encoded))) if encoded else None


def _nccl_version(torch) -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version[:3])
    return str(version)


def _cuda_state(torch) -> tuple[bool, int, str | None]:
    """(is_available, device_count, the warning torch gave when CUDA would not start)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
    message = next((str(w.message) for w in caught if "CUDA" in str(w.message)), None)
    return available, count, message


def probe_torch() -> dict:
    info = {
        "installed": False, "version": None, "cuda": None, "arch_list": [], "cudnn": None, "nccl": None,
        "cuda_available": False, "device_count": 0, "cuda_warning": None, "error": None, "cudnn_compiled": None,
    }
    if importlib.util.find_spec("torch") is None:
        return info
    info["installed"] = True
    try:
        import torch
    except (Exception, SystemExit) as err:  # a broken install is a finding, not a crash
        info["error"] = f"import torch failed: {type(err).__name__}: {err}"
        return info
    info["version"] = str(torch.__version__)
    info["cuda"] = torch.version.cuda
    if info["cuda"]:
        info["arch_list"] = list(torch.cuda.get_arch_list())
        info["cuda_available"], info["device_count"], info["cuda_warning"] = _cuda_state(torch)
        info["nccl"] = _nccl_version(torch)
    try:
        info["cudnn"] = format_cudnn_version(torch.backends.cudnn.version())
    except RuntimeError:
        info["cudnn"] = None
    info["cudnn_compiled"] = _cudnn_compiled(torch)
    return info


def _cudnn_compiled(torch) -> str | None:
    """The cuDNN torch was built with (torch._C._cudnn.getCompileVersion(): (9, 10, 2)); None without cuDNN."""
    try:
        major, minor, patch = torch._C._cudnn.getCompileVersion()
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return f"{major}.{minor}.{patch}"
