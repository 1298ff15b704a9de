"""``accel = "hopper"`` (and the TE route's check): whether its kernels can run here, and the swap itself."""

from __future__ import annotations

import torch

from gptforge.core.findings import Finding, Severity
from gptforge.core.installed import dsl_directory, import_error, outside_site_packages
from gptforge.errors import UsageError

HOPPER_MODULES = ("flash_attn.cute.interface", "quack.gemm_interface", "quack.epilogue.library",
                  "quack.linear_cross_entropy")
NORM_ROWS = 128  # rows of tokens per partial sum of inductor's LayerNorm backward (its mix-order reduction)
WHERE_HOPPER_IS = "`pixi run -e hopper train-gpt2` trains with them"


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


def use_hopper(model: torch.nn.Module, cuda_graphs: bool) -> tuple[dict, list[Finding]]:
    """Swap MODEL's attention, MLPs and loss for the hopper set's; (torch.compile's options, the notes)."""
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
    notes = [Finding("accel-hopper", Severity.INFO, "accel=hopper: attention from cuDNN's forward and FlashAttention 4's "
                     "backward, the qkv bias gradient from its weight-gradient GEMM, quack's GEMM epilogues in the MLP "
                     f"and the loss (its softmax over the padded vocabulary), CUDA graphs, {NORM_ROWS}-row "
                     "LayerNorm-backward partials")]
    if not cuda_graphs:
        notes.append(Finding("accel-hopper-without-cuda-graphs", Severity.WARNING, "accel=hopper runs without CUDA "
                             "graphs here (compile=false, DeepSpeed or FSDP): its kernels pay inside the compiled step's "
                             "CUDA graphs, so this step is slower than with accel=triton"))
    graphs = list_mode_options("reduce-overhead" if cuda_graphs else "default")  # default: no CUDA graphs
    options = {**graphs, "triton.mix_order_reduction_split_size": NORM_ROWS}
    return {"options": options}, notes
