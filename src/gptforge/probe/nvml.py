"""The NVIDIA driver and GPUs, read through NVML (nvidia-ml-py)."""

from __future__ import annotations

from gptforge.probe.cudart import format_runtime_version


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(pynvml, index: int) -> dict:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "index": index,
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "compute_capability": f"{major}.{minor}",
        "memory_total_mib": int(memory.total) // 2**20,
        "memory_free_mib": int(memory.free) // 2**20,
    }


def probe_nvml() -> dict:
    """Driver version, the newest CUDA it supports, and each GPU; ``found`` False when there is no driver.

    ``status`` is "ok", "no-driver" (libnvidia-ml missing or the kernel module not loaded) or "error"
    (NVML is there but failed, e.g. a driver/library version mismatch after an upgrade without reboot).
    """
    info = {"status": "no-driver", "driver_version": None, "cuda_version": None, "gpus": [], "error": None}
    try:
        import pynvml
    except ImportError as err:
        info["error"] = f"nvidia-ml-py is not installed ({err})"
        return info
    absent = tuple(
        getattr(pynvml, name)
        for name in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")
        if hasattr(pynvml, name)
    )
    try:
        pynvml.nvmlInit()
    except absent as err:
        info["error"] = f"no NVIDIA driver found ({_text(err)})"
        return info
    except pynvml.NVMLError as err:
        info["status"], info["error"] = "error", f"NVML failed to start: {_text(err)}"
        return info
    try:
        info["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        info["cuda_version"] = format_runtime_version(pynvml.nvmlSystemGetCudaDriverVersion())
        info["gpus"] = [_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        info["status"] = "ok"
    except pynvml.NVMLError as err:
        info["status"], info["error"] = "error", f"NVML query failed: {_text(err)}"
    finally:
        pynvml.nvmlShutdown()
    return info


def driver_and_ccs() -> tuple[str, tuple[tuple[int, int], ...]]:
    """This machine's driver version and its GPUs' compute capabilities (what ``compat recommend`` needs)."""
    from gptforge.core.versions import parse_cc
    from gptforge.errors import UsageError

    info = probe_nvml()
    if info["status"] != "ok":
        raise UsageError("--driver", f"not given, and this machine's driver cannot be read: {info['error']}",
                         "pass --driver V (the version nvidia-smi prints) and --gpu NAME")
    return info["driver_version"], tuple(parse_cc(gpu["compute_capability"]) for gpu in info["gpus"])
