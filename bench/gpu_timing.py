"""Timing helpers of the GPU micro-benchmarks (bench/attention_kernels.py, bench/xent_kernel.py): CUDA-event time
of a step, the host time to issue it, and the shared tail of a benchmark's main (no GPU: exit 2; else the table
and $GPTFORGE_BENCH_OUT/NAME.json)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch


def cuda_ms(step, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def launch_ms(step, iters: int) -> float:
    """Host time to issue one STEP (the GPU drained first): where it reaches cuda_ms, the step is bound by
    its Python and launch overhead, not by its kernels."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host * 1000 / iters


def write_gpu_report(name: str, rows: list[dict]) -> Path:
    """ROWS with the GPU and torch they came from, as $GPTFORGE_BENCH_OUT/NAME.json (default: here)."""
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", ".")) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    return out


def run_gpu_bench(name: str, args, run, print_table) -> int:
    """The shared tail of a GPU benchmark's main: refuse without a GPU, else RUN(ARGS), print its rows'
    table and write them as NAME.json."""
    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    rows = run(args)
    print_table(rows)
    write_gpu_report(name, rows)
    return 0
