"""The speed work: faster kernels swapped into the plain model after it is built, and what the step needs with them.

The config key ``accel`` picks one set:
- ``none``: nothing is swapped; torch ops throughout.
- ``triton`` (the default): the project's Triton cross-entropy kernel behind the model's fused loss, on CUDA.
- ``hopper``: triton's, and on an sm_90 GPU with the hopper environment's packages (flash-attn-4,
  quack-kernels, the CuTe DSL): attention from cuDNN's forward and FlashAttention 4's backward, the qkv
  bias gradient from its weight-gradient GEMM, the MLP and the loss's softmax in quack's GEMM epilogues, the
  step compiled into CUDA graphs with 128-row LayerNorm-backward partials. The configs named ``*-hopper``
  set it (BENCHMARKS.md has what it measured).
- ``te-fp8``: triton's, and TransformerEngine's layers in the blocks, trained in FP8 (sm_89 and newer).

``check`` says before anything is written whether the set can run here; ``accelerate`` swaps the modules and
returns the compile options, the optimizer choice and the notes the trainer logs. This package is the only
importer of flash-attn-4, quack, the CuTe DSL, TransformerEngine and the project's Triton kernels.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

from gptforge.core.installed import dsl_directory, outside_site_packages
from gptforge.errors import UsageError

CHOICES = ("none", "triton", "hopper", "te-fp8")
HOPPER_MODULES = ("flash_attn.cute.interface", "quack.gemm_interface", "quack.epilogue.library",
                  "quack.linear_cross_entropy")
NORM_ROWS = 128  # rows of tokens per partial sum of inductor's LayerNorm backward (its mix-order reduction)
WHERE_HOPPER_IS = "`pixi run -e hopper train-gpt2` trains with them"


@dataclass
class Plan:
    compile_options: dict = field(default_factory=dict)  # torch.compile's keyword arguments
    cuda_graphs: bool = False  # the compiled step runs as CUDA graphs
    fused_optimizer: bool = False  # torch AdamW's fused CUDA kernel (else its foreach path)
    notes: list[str] = field(default_factory=list)


def import_error(module: str) -> str | None:
    """Why MODULE cannot be imported (the exception's first line), or None when it can."""
    try:
        importlib.import_module(module)
    except Exception as e:  # an installed-but-broken extension raises more than ImportError
        first = (str(e).splitlines() or [""])[0]
        return f"{type(e).__name__}: {first[:200]}"
    return None


def sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def hopper_blocker(device: torch.device, precision: str, dropout: float) -> str | None:
    """Why accel=hopper cannot run here, or None when it can."""
    if not sm90(device):
        return "its kernels need an sm_90 GPU (H100, H200)"
    if precision != "bf16":
        return f"its kernels need bf16 (this run is {precision})"
    if dropout:
        return f"FlashAttention 4 has no dropout (dropout={dropout})"
    if not torch.backends.cudnn.is_available():
        return "cuDNN's attention needs torch built with cuDNN"
    for module in HOPPER_MODULES:
        if (error := import_error(module)) is not None:
            return f"{module} is not importable ({error}); {WHERE_HOPPER_IS}"
    if outside := outside_site_packages(dsl_directory()):
        return (f"the CuTe DSL is installed outside a site-packages directory ({outside}), where quack's kernel "
                "cache fails on it; install it into the environment with pip")
    return None


def te_blocker(device: torch.device) -> str | None:
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return "FP8 needs an sm_89 or newer GPU"
    if (error := import_error("transformer_engine.pytorch")) is not None:
        return f"TransformerEngine is not importable ({error})"
    return None


def check(choice: str, device: torch.device, precision: str, dropout: float) -> None:
    """Raise a UsageError naming the fix when CHOICE cannot run on DEVICE."""
    why = hopper_blocker(device, precision, dropout) if choice == "hopper" else \
        te_blocker(device) if choice == "te-fp8" else None
    if why:
        raise UsageError("accel", f"{choice}: {why}", "accel=triton trains with the kernels that need nothing more")


def accelerate(model: torch.nn.Module, choice: str, device: torch.device, precision: str, compiled: bool) -> Plan:
    """Swap CHOICE's modules into MODEL (built and on DEVICE; ``check`` has passed) and say what the step needs."""
    plan = Plan(fused_optimizer=device.type == "cuda")
    if choice != "none" and device.type == "cuda":
        from gptforge.accel.xent_kernel import use_kernel

        plan.notes.append("loss: the Triton cross-entropy kernel" if use_kernel() else
                          "loss: torch ops (Triton is not importable)")
    if choice == "hopper":
        use_hopper(model, plan, compiled)
    elif choice == "te-fp8":
        from gptforge.accel.te import use_te_fp8

        plan.notes.append(f"TransformerEngine: {use_te_fp8(model)} Linear layers in FP8 (HYBRID, delayed scaling)")
    elif sm90(device):
        plan.notes.append(f"an sm_90 GPU: accel=hopper (the gpt2-124m-hopper config) trains faster; {WHERE_HOPPER_IS}")
    return plan


def use_hopper(model: torch.nn.Module, plan: Plan, compiled: bool) -> None:
    from torch._inductor import list_mode_options

    from gptforge.accel.attention import FlashAttention
    from gptforge.accel.loss import EpilogueLoss, epilogue_fits
    from gptforge.accel.mlp import EpilogueMLP

    cfg = model.cfg
    if not epilogue_fits(model.loss.chunk, cfg.hidden_size, cfg.padded_vocab_size):
        raise UsageError("accel", f"hopper: quack's loss takes a padded vocabulary ({cfg.padded_vocab_size}) of a "
                         f"multiple of 128 and a hidden-size ({cfg.hidden_size}) of 8", "accel=triton")
    for block in model.blocks:
        block.attn, block.mlp = FlashAttention(block.attn), EpilogueMLP(block.mlp)
    model.loss = EpilogueLoss(model.loss.chunk)
    plan.compile_options = {"options": {**list_mode_options("reduce-overhead"),
                                        "triton.mix_order_reduction_split_size": NORM_ROWS}}
    plan.cuda_graphs = True
    plan.notes.append("accel=hopper: attention from cuDNN's forward and FlashAttention 4's backward, the qkv bias "
                      "gradient from its weight-gradient GEMM, quack's GEMM epilogues in the MLP and the loss (its "
                      f"softmax over the padded vocabulary), CUDA graphs, {NORM_ROWS}-row LayerNorm-backward partials")
    if not compiled:
        plan.notes.append("accel=hopper runs uncompiled here (compile=false or DeepSpeed): its kernels pay inside the "
                          "compiled step's CUDA graphs, so this step is slower than with accel=triton")
