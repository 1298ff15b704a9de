"""Layer factories: torch-native by default, apex or TransformerEngine only when installed AND asked for.

A request for an accelerator that is not importable falls back to torch and says so in ``notes``
(the trainer logs them), so a config written for a GPU box still runs on a laptop.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field

from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptforge.model.flash4 import FORWARDS as FLASH4_FORWARDS

# attention-backend key -> the SDPA kernel it pins (auto: PyTorch's own choice, flash on Hopper at bf16)
ATTENTION_BACKENDS = {
    "auto": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
ATTENTION_CHOICES = (*ATTENTION_BACKENDS, *FLASH4_FORWARDS)  # the latter: FlashAttention 4 outside SDPA (model/flash4.py)


def import_error(module: str) -> str | None:
    """Why MODULE cannot be imported (the exception's first line), or None when it can."""
    try:
        importlib.import_module(module)
    except Exception as e:  # an installed-but-broken extension raises more than ImportError
        first = (str(e).splitlines() or [""])[0]
        return f"{type(e).__name__}: {first[:200]}"
    return None


def importable(module: str) -> bool:
    return import_error(module) is None


@dataclass
class LayerBackend:
    layer_norm: str = "torch"  # torch | apex | te
    linear: str = "torch"  # torch | te
    attention: str = "auto"  # one of ATTENTION_CHOICES
    mlp: str = "torch"  # torch | quack (GEMMs with GELU in their epilogues)
    loss_chunk: int = 0  # tokens per chunk of the fused output layer + cross-entropy; 0: full logits
    loss_fp8: bool = False  # the fused output layer's matmuls in FP8
    loss_fp8_logits: bool = True  # with loss_fp8: the logits matmul too (else only the two gradient matmuls)
    loss_epilogue: bool = False  # the fused loss's softmax in the logits GEMM's epilogue (quack, sm_90)
    bf16_residual: bool = False  # the residual stream in bf16 under bf16 autocast (float32 otherwise)
    qkv_bias_gemm: bool = False  # the qkv projection's bias gradient from its weight-gradient GEMM (model/bias_gemm.py)
    mlp_bias_gemm: bool = False  # with mlp="quack": the up-projection's bias gradient from its weight-gradient GEMM
    notes: list[str] = field(default_factory=list)


def resolve_backend(apex_layernorm: bool = False, transformer_engine: bool = False, attention: str = "auto",
                    loss_chunk: int = 0) -> LayerBackend:
    backend = LayerBackend(attention=attention, loss_chunk=loss_chunk)
    if attention != "auto" and attention not in FLASH4_FORWARDS:  # those notes come from model/kernels.py, which knows the GPU
        backend.notes.append(f"attention: SDPA pinned to the {attention} kernel")
    if loss_chunk:
        backend.notes.append(f"loss: fused output layer + cross-entropy, {loss_chunk} tokens per chunk (no full logits)")
    if transformer_engine:
        error = import_error("transformer_engine.pytorch")
        if error is None:
            backend.layer_norm = backend.linear = "te"
            backend.notes.append("TransformerEngine layers: on")
        else:
            backend.notes.append(f"TransformerEngine asked for but not importable ({error}): torch.nn layers")
    if apex_layernorm and backend.layer_norm == "torch":
        error = import_error("apex.normalization")
        if error is None:
            backend.layer_norm = "apex"
            backend.notes.append("apex FusedLayerNorm: on")
        else:
            backend.notes.append(f"apex FusedLayerNorm asked for but apex is not importable ({error}): torch LayerNorm")
    return backend


def make_layer_norm(backend: LayerBackend, dim: int) -> nn.Module:
    if backend.layer_norm == "apex":
        from apex.normalization import FusedLayerNorm

        return FusedLayerNorm(dim)
    if backend.layer_norm == "te":
        import transformer_engine.pytorch as te

        return te.LayerNorm(dim)
    return nn.LayerNorm(dim)


def make_linear(backend: LayerBackend, in_features: int, out_features: int) -> nn.Module:
    if backend.linear == "te":
        import transformer_engine.pytorch as te

        return te.Linear(in_features, out_features, bias=True)
    return nn.Linear(in_features, out_features, bias=True)


def attention_kernel(name: str):
    """The context that pins SDPA to one kernel (it raises there if that kernel cannot take the call)."""
    backend = ATTENTION_BACKENDS[name]
    return contextlib.nullcontext() if backend is None else sdpa_kernel([backend])
