"""Reads the live machine. Each part is a small function returning plain data (JSON-ready dicts)
and never raising because something is absent: absence is data, judged later by the doctor.
"""

from __future__ import annotations

import os
import platform
import sys

from gptforge.probe.compilers import probe_compilers
from gptforge.probe.cuda_home import probe_cuda_home
from gptforge.probe.cudart import probe_loaded_libcudart
from gptforge.probe.nvcc import probe_nvcc
from gptforge.probe.nvml import probe_nvml
from gptforge.probe.packages import probe_apex, probe_deepspeed, probe_transformer_engine
from gptforge.probe.torch_info import probe_torch

ENV_VARS = ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "LD_LIBRARY_PATH", "CC", "CXX", "CUDAHOSTCXX",
            "NVCC_CCBIN", "CONDA_PREFIX")


def probe_python() -> dict:
    return {"version": platform.python_version(), "executable": sys.executable}


def probe_machine(env: dict | None = None) -> dict:
    """Everything doctor looks at. torch is imported before the libcudart and apex probes need it."""
    env = dict(os.environ if env is None else env)
    nvcc = probe_nvcc(env)
    nvcc_default_host = (nvcc["cuda_home"] or nvcc["path"] or {}).get("host_compiler")
    torch = probe_torch()
    return {
        "python": probe_python(),
        "driver": probe_nvml(),
        "nvcc": nvcc,
        "cuda_home": probe_cuda_home(env),
        "compilers": probe_compilers(nvcc_default_host, env),
        "torch": torch,
        "libcudart_loaded": probe_loaded_libcudart(),
        "apex": probe_apex(),
        "deepspeed": probe_deepspeed(),
        "transformer_engine": probe_transformer_engine(),
        "env": {name: env.get(name) for name in ENV_VARS},
    }
