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
returns the compile options, the optimizer choice and the notes the trainer logs (accel/hopper.py holds the
hopper set's). This package is the only importer of flash-attn-4, quack, the CuTe DSL and Triton, and the
trainer's only user of TransformerEngine (tests/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gptforge.core.findings import Finding, Severity
from gptforge.errors import UsageError


@dataclass
class Plan:
    compile_options: dict = field(default_factory=dict)  # torch.compile's keyword arguments
    cuda_graphs: bool = False  # the compiled step runs as CUDA graphs
    fused_optimizer: bool = False  # torch AdamW's fused CUDA kernel (else its foreach path)
    notes: list[Finding] = field(default_factory=list)


def check(choice: str, device: torch.device, precision: str, dropout: float) -> None:
    """Raise a UsageError naming the fix when CHOICE cannot run on DEVICE."""
    if choice not in ("hopper", "te-fp8"):
        return
    from gptforge.accel.hopper import hopper_blocker, te_blocker

    why = hopper_blocker(device, precision, dropout) if choice == "hopper" else te_blocker(device)
    if why:
        raise UsageError("accel", f"{choice}: {why}", "accel=triton trains with the kernels that need nothing more")


def accelerate(model: torch.nn.Module, choice: str, device: torch.device, precision: str, cuda_graphs: bool) -> Plan:
    """Swap CHOICE's modules into MODEL (built and on DEVICE; ``check`` has passed) and say what the step needs.
    CUDA_GRAPHS: the step is compiled whole and may run as CUDA graphs (not under compile=false, DeepSpeed, FSDP)."""
    plan = Plan(fused_optimizer=device.type == "cuda")
    if choice != "none" and device.type == "cuda":
        from gptforge.accel.xent_kernel import use_kernel

        kernel = use_kernel()  # under hopper it computes the loss of evaluations: training's is quack's (below)
        if choice != "hopper":
            plan.notes.append(Finding("loss-triton-kernel", Severity.INFO, "loss: the Triton cross-entropy kernel") if kernel
                              else Finding("loss-torch-ops", Severity.WARNING, "loss: torch ops (no Triton)"))
    if choice == "hopper":
        from gptforge.accel.hopper import use_hopper

        plan.compile_options, notes = use_hopper(model, cuda_graphs)
        plan.cuda_graphs = cuda_graphs
        plan.notes += notes
    elif choice == "te-fp8":
        from gptforge.accel.te import use_te_fp8

        plan.notes.append(Finding("accel-te-fp8", Severity.INFO,
                                  f"TransformerEngine: {use_te_fp8(model)} Linear layers in FP8 (HYBRID, delayed scaling)"))
    elif device.type == "cuda":
        from gptforge.accel.hopper import WHERE_HOPPER_IS, sm90

        if sm90(device):
            plan.notes.append(Finding("accel-hopper-suggested", Severity.INFO,
                                      f"an sm_90 GPU: accel=hopper (the gpt2-124m-hopper config) trains faster; {WHERE_HOPPER_IS}"))
    return plan
