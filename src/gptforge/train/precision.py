"""Numeric precision: bf16 autocast where the GPU has it, fp16 + loss scaling where not, fp32 on CPU.

On CPU ``auto`` picks fp32: bf16 autocast there is emulated on most x86 cores (slower than fp32 on the
machines we measured) and fp32 keeps CPU runs bit-reproducible, which the resume tests rely on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from gptforge.core.findings import Finding, Severity

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Precision:
    name: str
    device_type: str
    note: Finding  # the run's startup note: code precision, or precision-fallback where the device lacks what was asked

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    def autocast(self):
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def make_scaler(self):
        """A GradScaler for fp16 (its loss scaling keeps small gradients alive); None otherwise."""
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device_type)


def choose(requested: str, device: torch.device) -> Precision:
    kind = device.type
    if requested == "auto":
        if kind == "cuda":
            if torch.cuda.is_bf16_supported():
                return Precision("bf16", kind, chosen("bf16 autocast (auto: the GPU supports bf16)"))
            return Precision("fp16", kind, chosen("fp16 autocast + GradScaler (auto: this GPU has no bf16)"))
        return Precision("fp32", kind, chosen("fp32 (auto on CPU: exact and faster than emulated bf16)"))
    if requested == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        return Precision("fp16", kind, fallback("fp16 autocast + GradScaler (bf16 asked for, but this GPU has none)"))
    if requested == "fp16" and kind == "cpu":
        return Precision("fp32", kind, fallback("fp32 (fp16 asked for, but CPU autocast has no fp16 path)"))
    return Precision(requested, kind, chosen(f"{requested} {'autocast' if requested != 'fp32' else ''} (asked for)".replace("  ", " ")))


def chosen(what: str) -> Finding:
    return Finding("precision", Severity.INFO, f"precision: {what}")


def fallback(what: str) -> Finding:
    return Finding("precision-fallback", Severity.WARNING, f"precision: {what}")
