"""Hopper/Blackwell kernels from outside packages, each on only when asked for, installed and the GPU can run it.

- ``attention-backend = "flash4"``: FlashAttention 4's Hopper/Blackwell kernels (the flash-attn-4
  package), called through the custom ops of ``model/flash4.py`` in place of SDPA; ``"cudnn-flash4"``:
  cuDNN's forward kernel with FA4's backward, through the same ops.
- ``gelu-epilogue = true``: the MLP of model/mlp_epilogue.py (quack-kernels' GEMMs; no GELU kernels of
  their own), bias + GELU in the up-projection's epilogue and GELU's derivative with the bias gradient in the
  down-projection's input-gradient GEMM; with ``mlp-bias-gemm = true`` that bias gradient comes from the
  up-projection's weight-gradient GEMM instead.
- ``loss-epilogue = true``: the fused loss from quack-kernels' scaled-exp linear cross-entropy, the
  softmax's exponentials and sums in the logits GEMM's epilogue (model/lce_epilogue.py; sm_90 only).

Each ``use_*`` sets BACKEND and returns the note the trainer logs: on, or asked for but off and why.
"""

from __future__ import annotations

import torch

from gptforge.core.installed import dsl_directory, outside_site_packages
from gptforge.model.flash4 import FORWARDS as FLASH4_FORWARDS, MODULE as FA4_MODULE
from gptforge.model.layers import LayerBackend, import_error
from gptforge.model.lce_epilogue import epilogue_fits

QUACK_MODULE = "quack.epilogue.library"  # what model/mlp_epilogue.py imports
QUACK_LCE_MODULE = "quack.linear_cross_entropy"
SUPPORTED_MAJORS = (9, 10)  # sm_90 (Hopper) and sm_100 (Blackwell): FA4's and quack's SM90/SM100 kernels


def hopper_or_blackwell(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] in SUPPORTED_MAJORS


def hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def use_flash4(backend: LayerBackend, device: torch.device, dropout: float) -> str | None:
    """attention-backend flash4 (FA4 both ways) or cudnn-flash4 (cuDNN's forward, FA4's backward)."""
    if backend.attention not in FLASH4_FORWARDS:
        return None
    why = None
    if not hopper_or_blackwell(device):
        why = "needs an sm_90 or sm_100 GPU"
    elif dropout:
        why = f"has no dropout (dropout={dropout})"
    elif (error := import_error(FA4_MODULE)) is not None:
        why = f"is not importable ({error}; pip install flash-attn-4)"
    elif backend.attention == "cudnn-flash4" and not torch.backends.cudnn.is_available():
        why = "its forward needs torch built with cuDNN"
    if why:
        asked = "FlashAttention 4" if backend.attention == "flash4" else "cuDNN forward + FlashAttention 4 backward"
        backend.attention = "auto"
        return f"{asked} asked for but {why}: SDPA's own choice of kernel"
    if backend.attention == "cudnn-flash4":
        return ("attention: cuDNN's forward (through SDPA's cuDNN op) and FlashAttention 4's backward (flash_attn.cute), "
                "causal, as custom ops in the compiled graph")
    return "attention: FlashAttention 4 (flash_attn.cute), causal, as custom ops in the compiled graph"


def quack_unusable(device: torch.device, module: str, sm90_only: bool = False) -> str | None:
    """Why quack's MODULE cannot run on DEVICE (the end of an "asked for but ..." note), or None when it can."""
    if sm90_only and not hopper(device):
        return "needs an sm_90 GPU"
    if not hopper_or_blackwell(device):
        return "needs an sm_90 or sm_100 GPU"
    error = import_error(module)
    if error is not None:
        return f"quack is not importable ({error}; pip install quack-kernels)"
    outside = outside_site_packages(dsl_directory())
    if outside:
        return (f"the CuTe DSL is installed outside a site-packages directory ({outside}), where quack's kernel "
                "cache fails on it; install it into the environment with pip")
    return None


def use_gelu_epilogue(backend: LayerBackend, device: torch.device, asked: bool, float8: str = "off") -> str | None:
    if not asked:
        return None
    if backend.linear != "torch":
        return "GELU epilogue asked for but TransformerEngine layers are on: TE's MLP"
    if float8 != "off":
        return f"GELU epilogue asked for but float8={float8} is on (quack's GEMMs here are bf16): torchao's MLP"
    why = quack_unusable(device, QUACK_MODULE)
    if why:
        return f"GELU epilogue asked for but {why}: torch MLP"
    backend.mlp = "quack"
    return ("MLP: quack GEMMs, bias + GELU in the up-projection's epilogue, GELU's derivative in the backward "
            "GEMM's; cuBLAS for the backward's plain GEMMs")


def loss_epilogue_blocker(backend: LayerBackend, device: torch.device, precision: str, padded_vocab: int,
                          hidden: int) -> str | None:
    """Why the epilogue cross-entropy cannot run here (the end of an "asked for but ..." note), or None."""
    if not backend.loss_chunk:
        return "needs fused-loss=true"
    if backend.loss_fp8:
        return "fp8-output is on and keeps the output layer"
    unusable = quack_unusable(device, QUACK_LCE_MODULE, sm90_only=True)
    if unusable:
        return unusable
    if precision != "bf16":
        return f"needs bf16 (the run is {precision})"
    if not epilogue_fits(backend.loss_chunk, hidden, padded_vocab):
        return (f"loss-chunk-tokens ({backend.loss_chunk}) and the padded vocabulary ({padded_vocab}) must be "
                f"multiples of 128 and hidden-size ({hidden}) of 8")
    return None


def use_loss_epilogue(backend: LayerBackend, device: torch.device, asked: bool, precision: str,
                      padded_vocab: int, hidden: int) -> str | None:
    """Turn the epilogue cross-entropy on in BACKEND when asked for and possible; the note says which.

    Call after the FP8 output layer has been decided: that layer, when on, keeps the output layer."""
    if not asked:
        return None
    why = loss_epilogue_blocker(backend, device, precision, padded_vocab, hidden)
    if why:
        return f"epilogue cross-entropy asked for but {why}: gptforge's xent kernel"
    backend.loss_epilogue = True
    return ("loss: quack's scaled-exp linear cross-entropy, the softmax in the logits GEMM's epilogue "
            "(over the padded vocabulary)")


# What `hopper-kernels` (train/hopper_keys.py; auto in the GPT-2 configs) trains GPT-2 with on an H100/H200: the
# fastest configuration measured whose loss on held-out data is the defaults' (BENCHMARKS.md: 1.30x nanoGPT; nine
# seeds, runs 54-58); mlp-bias-gemm since runs 93-96 (+0.4% at 124M, its loss the same on three seeds; the 350M and
# larger configs set it false: +0.2% at 350M, within the noise, run 100); bf16-weights since runs 103-105 (+0.5-0.6%
# at 124M, +1.5% at 350M, its loss the same on eight seeds; off by itself where it cannot apply, under DDP for one);
# compile-norm-rows=128 since runs 108-112 (+0.3-1.0% at 124M, +0.5% at 350M; only the float32 summation order of
# the LayerNorms' weight and bias gradients changes); compile-tied-scatter since runs 114-119 (+0.9% and +0.2% at
# 124M, 0.0% at 350M; only the float32 addition order of the tied embedding's gradient changes, its loss the same on
# eight seeds).
HOPPER_KEYS = ("attention-backend=cudnn-flash4", "gelu-epilogue=true", "loss-epilogue=true", "qkv-bias-gemm=true",
               "mlp-bias-gemm=true", "bf16-weights=true", "compile-mode=reduce-overhead", "compile-norm-rows=128",
               "compile-tied-scatter=true")


def hopper_keys_blocker(device: torch.device) -> str | None:
    """Why HOPPER_KEYS would not all take effect on DEVICE, or None when every one of them would."""
    if not hopper(device):
        return "needs an sm_90 GPU"
    if (error := import_error(FA4_MODULE)) is not None:
        return f"flash-attn-4 is not importable ({error})"
    if not torch.backends.cudnn.is_available():
        return "cuDNN's attention needs torch built with cuDNN"
    return quack_unusable(device, QUACK_MODULE) or quack_unusable(device, QUACK_LCE_MODULE, sm90_only=True)
