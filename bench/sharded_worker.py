"""One rank of a bench/sharded.py run, started by torchrun: gptforge's Trainer set up as `gptforge train` sets it up
(the config, the engine and the embedded corpus), then its steps as the training loop runs them (step N+1 queued
before step N's loss is read), with no evaluation and no checkpoint in the timed window.

SPEC (a JSON object, the one argument): config, overrides, run_dir, deepspeed (a JSON path or null), fsdp (the
unit or null), host_waits (true: DeepSpeed's optimizer step as released), device (cuda or cpu), warmup and steps
(step counts), profile_steps (more steps after the timed ones, rank 0 under torch.profiler; 0: none), result and
profile (the files rank 0 writes: the measurement as JSON, the profiler's tables).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))



def profile_steps(trainer, steps: int, path: Path) -> dict:
    """STEPS more steps, rank 0 under torch.profiler: ops (and the engines' labelled regions) by self device time,
    by self host time and by host time with what they call, and the device's busy and idle time per step, written
    to PATH."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from throughput import gpu_gaps

    cuda = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with (profile(activities=activities) if trainer.env.is_main else contextlib.nullcontext()) as prof:
        for _ in trainer.steps(trainer.step + steps):
            pass
        if cuda:
            torch.cuda.synchronize()
    if not trainer.env.is_main:
        return {}
    averages = prof.key_averages()
    keys = (["self_cuda_time_total"] if cuda else []) + ["self_cpu_time_total", "cpu_time_total"]
    tables = [f"sorted by {key}, {steps} steps\n" + averages.table(sort_by=key, row_limit=25, max_name_column_width=70)
              for key in keys]
    gaps = gpu_gaps(prof.events(), steps) if cuda else {}
    path.write_text("\n\n".join(tables) + "\n" + json.dumps(gaps, indent=1) + "\n")
    trace = path.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()
    return gaps


def main() -> int:
    spec = json.loads(sys.argv[1])
    import torch
    from rich.console import Console
    from torch._dynamo.utils import counters

    from gptforge.train.config import load_config
    from gptforge.train.loop import RunOptions, Trainer

    if spec.get("host_waits"):  # DeepSpeed's optimizer step as released, for the side-by-side
        from gptforge.train import deepspeed_engine
        deepspeed_engine.stop_host_waits = lambda optimizer: False
    cfg, _ = load_config(spec["config"], spec["overrides"])
    opts = RunOptions(run_dir=Path(spec["run_dir"]), config_name=spec["config"], device=spec["device"],
                      deepspeed=spec.get("deepspeed"), fsdp=spec.get("fsdp"))
    trainer = Trainer(cfg, opts, console=Console(quiet=True))
    trainer.preflight()
    trainer.setup()
    main_rank = trainer.env.is_main
    if main_rank:
        print("\n".join(note.message for note in trainer.notes), flush=True)
    try:
        started = time.perf_counter()
        warm = []
        for record in trainer.steps(spec["warmup"]):
            warm.append(record)
            if main_rank:
                print(f"warmup step {record['step']}: {record['step_ms']:.0f} ms", flush=True)
        warm_s = time.perf_counter() - started
        started = time.perf_counter()
        timed = list(trainer.steps(spec["warmup"] + spec["steps"]))
        window_s = time.perf_counter() - started
        gaps = profile_steps(trainer, spec["profile_steps"], Path(spec["profile"])) if spec["profile_steps"] else {}
    finally:
        trainer.close()
    if not main_rank:
        return 0
    tokens = cfg.global_batch_size * cfg.seq_length
    result = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
              "tokens_per_s_window": tokens * len(timed) / window_s,
              "step_ms": statistics.median(r["step_ms"] for r in timed), "step_ms_max": max(r["step_ms"] for r in timed),
              "steps_timed": len(timed), "warmup_s": round(warm_s, 1),
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if trainer.device.type == "cuda" else None,
              "last_loss": timed[-1]["loss"], "losses": [r["loss"] for r in warm + timed],
              "grad_norms": [r["grad_norm"] for r in warm + timed], "graph_breaks": sum(counters["graph_break"].values()),
              "graphs": counters["stats"].get("unique_graphs", 0), "notes": [note.message for note in trainer.notes], "profile": gaps}
    Path(spec["result"]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
