"""MFU: the dense bf16 peak table (each row with its source) and the PaLM utilisation figure."""

from __future__ import annotations

import pytest

from gptforge.train.peaks import Peak, load_table, lookup, mfu


@pytest.mark.parametrize("device_name,tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
])
def test_peak_of_known_gpus(device_name, tflops):
    assert lookup(device_name).bf16_flops == tflops * 1e12


def test_unknown_gpu_reports_no_mfu():
    peak = lookup("NVIDIA GeForce GTX 1080")
    assert peak.bf16_flops is None and peak.note().code == "mfu-not-reported"
    assert mfu(1e9, 1e5, peak) is None


def test_every_peak_has_a_source_url():
    assert all(row["source"].startswith("https://") for row in load_table())


def test_mfu_is_achieved_over_promised_flops_of_every_gpu():
    peak = Peak("test", 100e12, "")
    assert mfu(flops_per_token=1e9, tokens_per_second=25e3, peak=peak) == pytest.approx(0.25)
    assert mfu(flops_per_token=1e9, tokens_per_second=25e3, peak=peak, world_size=2) == pytest.approx(0.125)
