"""apex, DeepSpeed, TransformerEngine and the Hopper kernels: installed? which version? do their compiled parts load?

Versions come from package metadata; only the modules that must load for training are imported
(apex's CUDA extensions, transformer_engine.pytorch). DeepSpeed is never imported: its import can
start JIT builds; nor are flash-attn-4 and quack-kernels, whose DSL takes seconds to load.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from gptforge.core.installed import dsl_directory, installed_version, outside_site_packages

APEX_EXTENSIONS = ("fused_layer_norm_cuda", "amp_C", "apex_C")
TE_DISTRIBUTIONS = ("transformer_engine", "transformer_engine_torch", "transformer_engine_cu12",
                    "transformer_engine_cu13")
HOPPER_DISTRIBUTIONS = ("flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl")  # accel=hopper


def _try_import(module: str) -> str | None:
    """None when ``module`` imports, else the error as Python wrote it."""
    try:
        importlib.import_module(module)
    except (Exception, SystemExit) as err:  # any failure to load is what we report, even a sys.exit()
        return f"{type(err).__name__}: {err}"
    return None


def probe_apex() -> dict:
    installed = importlib.util.find_spec("apex") is not None
    info = {"installed": installed, "version": installed_version("apex"), "extensions": {}}
    if installed:
        info["extensions"] = {name: {"ok": (err := _try_import(name)) is None, "error": err}
                              for name in APEX_EXTENSIONS}
    return info


def probe_deepspeed() -> dict:
    version = installed_version("deepspeed")
    installed = version is not None or importlib.util.find_spec("deepspeed") is not None
    return {"installed": installed, "version": version}


def probe_transformer_engine() -> dict:
    packages = {name: v for name in TE_DISTRIBUTIONS if (v := installed_version(name)) is not None}
    installed = bool(packages) or importlib.util.find_spec("transformer_engine") is not None
    info = {"installed": installed, "version": packages.get("transformer_engine") or next(iter(packages.values()), None),
            "packages": packages, "import_ok": None, "import_error": None, "pip_cudnn_lib": pip_cudnn_lib(),
            "fp8_usable": None}  # judged by the doctor from the GPUs present
    if installed:
        info["import_error"] = _try_import("transformer_engine.pytorch")
        info["import_ok"] = info["import_error"] is None
    return info


def pip_cudnn_lib() -> str | None:
    """The lib folder of the pip cuDNN (nvidia-cudnn-cu*) torch loads, or None; found without loading it."""
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(folder, "lib")
        if os.path.isdir(lib):
            return lib
    return None


def probe_hopper_kernels() -> dict:
    """flash-attn-4, quack-kernels and the CuTe DSL: versions, and where the DSL lives (nothing imported)."""
    packages = {name: v for name in HOPPER_DISTRIBUTIONS if (v := installed_version(name)) is not None}
    directory = dsl_directory()
    return {"installed": bool(packages), "packages": packages, "dsl_directory": directory,
            "dsl_outside_site_packages": outside_site_packages(directory) is not None}
