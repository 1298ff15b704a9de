"""Hopper/Blackwell kernels from outside packages, each on only when asked for, installed and the GPU can run it.

- ``attention-backend = "flash4"``: FlashAttention 4's Hopper/Blackwell kernels (the flash-attn-4
  package), called through the custom ops of ``model/flash4.py`` in place of SDPA.
- ``gelu-epilogue = true``: the MLP's GEMMs from quack-kernels, bias + GELU in the up-projection's
  epilogue and GELU's derivative in the down-projection's input-gradient GEMM (no GELU kernels of
  their own).

Each ``use_*`` sets BACKEND and returns the note the trainer logs: on, or asked for but off and why.
"""

from __future__ import annotations

import torch

from gptforge.core.installed import dsl_directory, outside_site_packages
from gptforge.model.flash4 import MODULE as FA4_MODULE
from gptforge.model.layers import LayerBackend, import_error

QUACK_MODULE = "quack.mlp"
SUPPORTED_MAJORS = (9, 10)  # sm_90 (Hopper) and sm_100 (Blackwell): FA4's and quack's SM90/SM100 kernels


def hopper_or_blackwell(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] in SUPPORTED_MAJORS


def use_flash4(backend: LayerBackend, device: torch.device, dropout: float) -> str | None:
    if backend.attention != "flash4":
        return None
    why = None
    if not hopper_or_blackwell(device):
        why = "needs an sm_90 or sm_100 GPU"
    elif dropout:
        why = f"has no dropout (dropout={dropout})"
    elif (error := import_error(FA4_MODULE)) is not None:
        why = f"is not importable ({error}; pip install flash-attn-4)"
    if why:
        backend.attention = "auto"
        return f"FlashAttention 4 asked for but {why}: SDPA's own choice of kernel"
    return "attention: FlashAttention 4 (flash_attn.cute), causal, as custom ops in the compiled graph"


def use_gelu_epilogue(backend: LayerBackend, device: torch.device, asked: bool, float8: str = "off") -> str | None:
    if not asked:
        return None
    if backend.linear != "torch":
        return "GELU epilogue asked for but TransformerEngine layers are on: TE's MLP"
    if float8 != "off":
        return f"GELU epilogue asked for but float8={float8} is on (quack's GEMMs here are bf16): torchao's MLP"
    if not hopper_or_blackwell(device):
        return "GELU epilogue asked for but needs an sm_90 or sm_100 GPU: torch MLP"
    error = import_error(QUACK_MODULE)
    if error is not None:
        return f"GELU epilogue asked for but quack is not importable ({error}; pip install quack-kernels): torch MLP"
    outside = outside_site_packages(dsl_directory())
    if outside:
        return (f"GELU epilogue asked for but the CuTe DSL is installed outside a site-packages directory ({outside}), "
                "where quack's kernel cache fails on it; install it into the environment with pip: torch MLP")
    backend.mlp = "quack"
    return "MLP: quack GEMMs, bias + GELU in the up-projection's epilogue, its gradient in the down-projection's"
