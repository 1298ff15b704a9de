"""bench/bf16_weights_trace.py: bf16-weights traced against float32 weights and a rerun, in one process.

On the CPU bf16-weights cannot apply (B says so and trains as A), and the arithmetic is deterministic, so every
difference the trace reports must be exactly zero: a nonzero one is the trace's own fault (a view taken for a copy,
a state copied wrongly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import one_line_error

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bf16_weights_trace.py"


def trace(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--config", "gpt2-tiny", *args], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "GPTFORGE_BENCH_OUT": str(tmp_path)}, timeout=300)


def all_zero(tables: dict) -> bool:
    return all(value == 0.0 for table in tables.values() for value in table.values())


def test_on_cpu_every_difference_the_trace_reports_is_zero(tmp_path, train_data_cache):
    proc = trace(tmp_path, "--steps", "3", "--batch", "2", "--set", f"data-cache-dir={train_data_cache}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bf16-weights asked for but off" in proc.stdout
    report = json.loads((tmp_path / "bf16_weights_trace.json").read_text())
    assert report["same_start"] is True and len(report["losses"]["B"]) == 2
    for phase in ("first", "late"):
        assert all_zero(report[phase]["gradients"]) and all_zero(report[phase]["update"]), phase
    assert all_zero(report["final_distance"]) and report["drift"] == {"B": 0.0, "A2": 0.0}
    assert len(set(report["val_on_a_state"].values())) == 1
    assert report["final_norms"]["A"]["wte.weight"] > 0
    assert sorted(os.listdir(tmp_path)) == ["bf16_weights_trace.json"]  # run directories gone, the JSON whole


def test_too_few_steps_is_a_one_line_error(tmp_path):
    one_line_error(trace(tmp_path, "--steps", "1"), 2, "--steps must be >= 2")
