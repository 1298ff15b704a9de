"""The GPU's dense BF16 peak (the MFU denominator), looked up in configs/gpu_peaks.toml by the
GPU-name rule of core.gpus."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from gptforge.core.findings import Finding, Severity
from gptforge.core.gpus import longest_matches, words


@dataclass(frozen=True)
class Peak:
    device_name: str
    bf16_flops: float | None  # FLOP/s; None: unknown GPU or CPU, MFU is not reported
    source: str

    def note(self) -> Finding:
        if self.bf16_flops is None:
            return Finding("mfu-not-reported", Severity.INFO,
                           f"MFU not reported: no dense bf16 peak known for {self.device_name!r}")
        return Finding("mfu-peak", Severity.INFO,
                       f"MFU vs {self.device_name} dense bf16 peak {self.bf16_flops / 1e12:.1f} TFLOP/s ({self.source})")


def load_table() -> list[dict]:
    text = (resources.files("gptforge") / "configs" / "gpu_peaks.toml").read_text()
    return tomllib.loads(text)["gpu"]


def lookup(device_name: str) -> Peak:
    best = longest_matches(device_name, ((words(row["match"]), row) for row in load_table()))
    if not best:
        return Peak(device_name, None, "")
    return Peak(device_name, best[0]["bf16_tflops"] * 1e12, best[0]["source"])


def mfu(flops_per_token: float, tokens_per_second: float, peak: Peak, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation (PaLM appendix B) against the per-GPU peak times the GPU count."""
    if peak.bf16_flops is None:
        return None
    return flops_per_token * tokens_per_second / (peak.bf16_flops * world_size)
