"""Reads the live machine. Each part is a small function returning plain data (JSON-ready dicts)
and never raising because something is absent: absence is data, judged later by the doctor and the
build preflight. ``probe_machine`` puts the parts together as one typed ``Machine``.
"""

from __future__ import annotations

import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor

from gptforge.probe.compilers import probe_compilers
from gptforge.probe.cuda_home import probe_cuda_home
from gptforge.probe.cudart import probe_loaded_libcudart
from gptforge.probe.host_libs import probe_host
from gptforge.probe.machine import Machine
from gptforge.probe.nvcc import probe_nvcc
from gptforge.probe.nvml import probe_nvml
from gptforge.probe.packages import probe_apex, probe_deepspeed, probe_hopper_kernels, probe_transformer_engine
from gptforge.probe.torch_info import probe_torch

ENV_VARS = ("CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "LD_LIBRARY_PATH", "CC", "CXX", "CUDAHOSTCXX",
            "NVCC_CCBIN", "CONDA_PREFIX")


def probe_python() -> dict:
    return {"version": platform.python_version(), "executable": sys.executable}


def _default_host(nvcc: dict) -> str | None:
    return (nvcc["cuda_home"] or nvcc["path"] or {}).get("host_compiler")


def probe_machine(env: dict | None = None) -> Machine:
    """Everything the doctor and the build preflight look at.

    Order matters: torch, apex's extensions and TransformerEngine are imported first, then the
    process's libcudart maps are read (what training would load), and only then does the CUDA-root
    probe load the toolkit's own libcudart to ask its version (which would otherwise show up as loaded).
    """
    env = dict(os.environ if env is None else env)
    torch = probe_torch()
    apex, transformer_engine = probe_apex(), probe_transformer_engine()
    loaded = probe_loaded_libcudart()
    host = probe_host()  # after torch: the libstdc++ it loaded is the one extensions meet
    with ThreadPoolExecutor(max_workers=2) as pool:  # the external tools, at once: each may hang until its timeout
        nvcc_job = pool.submit(probe_nvcc, env)
        compilers_job = pool.submit(probe_compilers, lambda: _default_host(nvcc_job.result()), env)
        nvcc, compilers = nvcc_job.result(), compilers_job.result()
    return Machine.from_json({
        "python": probe_python(),
        "driver": probe_nvml(),
        "nvcc": nvcc,
        "cuda_home": probe_cuda_home(env),
        "compilers": compilers,
        "torch": torch,
        "libcudart_loaded": loaded,
        "apex": apex,
        "deepspeed": probe_deepspeed(),
        "transformer_engine": transformer_engine,
        "hopper_kernels": probe_hopper_kernels(),
        "host": host,
        "env": {name: env.get(name) for name in ENV_VARS},
    })
