"""Sharded engines against DDP on one host, at the same global batch: tokens/s, the ratio to DDP, peak memory.

Each run is gptforge's trainer under torchrun (bench/sharded_worker.py: set up as `gptforge train` sets it up, on
the embedded corpus prepared once and cached, its steps run as the training loop runs them), the same model and
micro batch for every variant. A variant (VARIANTS) is an engine and the choices that differ from its packaged
defaults: a DeepSpeed config's changes, module-level choices of the engines, compile off. Tokens/s is the median
over the steps after --warmup (compilation, allocator growth), each step timed on the device's clock as the
trainer logs it; "window" is the timed steps' tokens over their wall time. Peak memory is rank 0's
torch.cuda.max_memory_allocated. --profile names variants whose run ends with --profile-steps more steps under
torch.profiler (rank 0): ops by self device time and by self host time, and the device's idle time per step.

    python3 bench/sharded.py --gpus 2 --models 124m 350m --engines ddp fsdp zero2 zero3
    python3 bench/sharded.py --gpus 2 --engines ddp fsdp zero2 --profile fsdp-block zero2 --deadline 420
    python3 bench/sharded.py --weak-scaling 1 4 --models 124m --engines ddp fsdp

Writes OUT/sharded.json and OUT/sharded.md (the table; scaling.* for weak scaling), OUT/<run>.log and
OUT/<run>.profile.txt; prints the table. With --deadline (seconds from start) a run that could not finish in
time is not started, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from gptforge.process import kill_tree
from gptforge.train.deepspeed_engine import deepcompile_unavailable

ROOT = Path(__file__).resolve().parent.parent
SYNCS_BACK = {"bf16": {"check_grad_overflow": True}, "timers": {"throughput": {"enabled": True}}}
# name: engine ("fsdp": the unit; "deepspeed": the packaged config), "ds": changes to that config,
# "compile": False for eager, "host_waits": True for DeepSpeed's optimizer step as released (train/deepspeed_waits.py off)
VARIANTS = {
    "ddp": {},
    "fsdp": {"fsdp": "model"},
    "fsdp-block": {"fsdp": "block"},
    "zero2": {"deepspeed": "zero2"},
    "zero2-syncs": {"deepspeed": "zero2", "ds": SYNCS_BACK},  # DeepSpeed's own throughput timer and overflow check on
    "zero2-eager": {"deepspeed": "zero2", "compile": False},
    "zero2-overlap": {"deepspeed": "zero2", "ds": {"zero_optimization": {"overlap_comm": True}}},
    "zero2-bucket2e8": {"deepspeed": "zero2", "ds": {"zero_optimization": {"reduce_bucket_size": 200_000_000,
                                                                          "allgather_bucket_size": 200_000_000}}},
    "zero2-waits": {"deepspeed": "zero2", "host_waits": True},  # DeepSpeed's step as released, reading norms on the host
    "zero2-nocontig": {"deepspeed": "zero2", "ds": {"zero_optimization": {"contiguous_gradients": False}}},
    "zero1": {"deepspeed": "zero1", "ds": {"bf16": {"check_grad_overflow": False}}},
    "zero2-deepcompile": {"deepspeed": "zero2", "ds": {"compile": {"deepcompile": True}}},
    "zero3": {"deepspeed": "zero3"},
    "zero3-syncs": {"deepspeed": "zero3", "ds": {"timers": SYNCS_BACK["timers"]}},
    "zero3-leaf": {"deepspeed": "zero3", "ds": {"zero_optimization": {"leaf_module": {"classes": ["gptforge.model.gpt.Block"]}}}},
    "zero3-prefetch": {"deepspeed": "zero3", "ds": {"zero_optimization": {"stage3_prefetch_bucket_size": 200_000_000,
                                                                         "stage3_param_persistence_threshold": 1_000_000,
                                                                         "reduce_bucket_size": 200_000_000}}},
    "zero3-deepcompile": {"deepspeed": "zero3", "ds": {"compile": {"deepcompile": True}}},
}


def merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def deepspeed_config(name: str, work: Path) -> Path:
    variant = VARIANTS[name]
    packaged = resources.files("gptforge") / "configs" / "deepspeed" / f"{variant['deepspeed']}.json"
    path = work / f"{name}.json"
    path.write_text(json.dumps(merged(json.loads(packaged.read_text()), variant.get("ds", {})), indent=1))
    return path


def worker_spec(name: str, model: str, global_batch: int, args, work: Path, out: Path) -> dict:
    variant = VARIANTS[name]
    total = args.warmup + args.steps + args.profile_steps  # one schedule for every run, profiled or not
    overrides = [f"train-iters={total}", "lr-warmup-iters=10", f"micro-batch-size={args.micro}",
                 f"global-batch-size={global_batch}", "eval-interval=1000000", "eval-iters=1",
                 "save-interval=1000000", f"compile={str(variant.get('compile', True)).lower()}"]
    if args.data_cache_dir:
        overrides.insert(0, f"data-cache-dir={args.data_cache_dir}")
    return {"config": f"gpt2-{model}", "overrides": overrides + args.set, "run_dir": str(work / f"{model}-{name}"),
            "deepspeed": str(deepspeed_config(name, work)) if "deepspeed" in variant else None,
            "fsdp": variant.get("fsdp"), "host_waits": variant.get("host_waits", False), "device": args.device,
            "warmup": args.warmup, "steps": args.steps, "profile_steps": args.profile_steps if name in args.profile else 0,
            "result": str(work / f"{model}-{name}.result.json"), "profile": str(out / f"{model}-{name}.profile.txt")}


def first_gpus(n: int) -> str:
    """The first N of the GPUs this process may use (CUDA_VISIBLE_DEVICES, else all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ",".join(visible.split(",")[:n] if visible else map(str, range(n)))


def run_one(run: str, name: str, model: str, gpus: int, global_batch: int, args, work: Path, out: Path,
            timeout: float) -> dict:
    row = {"run": run, "engine": name, "model": model, "gpus": gpus, "global_batch": global_batch,
           "micro_batch": args.micro}
    if VARIANTS[name].get("ds", {}).get("compile", {}).get("deepcompile") and (why := deepcompile_unavailable()):
        return {**row, "rc": f"skipped: DeepCompile cannot run here: {why}"}  # the engine would run without it
    spec = worker_spec(name, model, global_batch, args, work, out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
           str(ROOT / "bench" / "sharded_worker.py"), json.dumps(spec)]
    device = {} if args.device == "cpu" else {"CUDA_VISIBLE_DEVICES": first_gpus(gpus)}
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"), **device}
    t0 = time.time()
    with open(out / f"{run}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # torchrun and its workers (each in a session of its own), freeing the GPUs
            kill_tree(proc.pid)
            proc.wait()
            rc = "timeout"
    row.update(wall_s=round(time.time() - t0, 1), rc=rc)
    result = Path(spec["result"])
    if rc == 0 and result.is_file():
        row.update(json.loads(result.read_text()))
    else:
        row["rc"] = rc if rc != 0 else "no result"
        row["error"] = first_error((out / f"{run}.log").read_text())
    print(json.dumps({k: v for k, v in row.items() if k not in ("error", "notes")}), flush=True)
    return row


def first_error(log: str) -> str:
    """The first exception line of a failed run's log (torchrun's own report follows it), else its end."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j] and not lines[j][0].isspace()), len(lines) - 1)
            return lines[end][:500]
    return "\n".join(lines[-5:])[-500:]


def table(rows: list[dict], baseline_of) -> str:
    lines = ["| model | engine | GPUs | global batch | tokens/s (median) | ratio | window tokens/s | step ms (max) | "
             "device idle ms/step | graphs | peak GiB/GPU | last loss | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['engine']} | {r['gpus']} | {r['global_batch']} |"
        if "tokens_per_s" not in r:
            why = r["rc"] if isinstance(r["rc"], str) else f"failed ({r['rc']})"
            lines.append(f"{head} {why} | | | | | | | | | {r.get('wall_s', '')} |")
            continue
        base = baseline_of(r)
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}" if base and base.get("tokens_per_s") else "n/a"
        idle = r.get("profile", {}).get("gpu_idle_ms_per_step")
        mem = f"{r['peak_mem_gib']:.2f}" if r.get("peak_mem_gib") is not None else "n/a"
        lines.append(f"{head} {r['tokens_per_s']:,.0f} | {ratio} | {r['tokens_per_s_window']:,.0f} | "
                     f"{r['step_ms']:.1f} ({r['step_ms_max']:.1f}) | {'' if idle is None else f'{idle:.1f}'} | "
                     f"{r['graphs']} | {mem} | {r['last_loss']:.4f} | {r['wall_s']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["124m"], help="packaged gpt2-* configs")
    p.add_argument("--engines", nargs="+", default=["ddp", "fsdp", "zero2", "zero3"], choices=VARIANTS, metavar="VARIANT",
                   help=f"run in the order given, of: {', '.join(VARIANTS)}")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--weak-scaling", nargs=2, type=int, metavar=("FEW", "MANY"),
                   help="each engine on FEW and on MANY GPUs, global batch growing with the GPUs")
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--per-gpu-batch", type=int, default=32, help="samples per GPU per step (global batch / GPUs)")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=15, help="steps before the timed ones")
    p.add_argument("--profile", nargs="*", default=[], choices=VARIANTS, metavar="VARIANT",
                   help="variants whose runs end under the profiler")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--run-timeout", type=int, default=300)
    p.add_argument("--deadline", type=float, help="seconds from now by which every run must be over")
    p.add_argument("--min-run-s", type=float, default=60, help="with --deadline: no run starts with less time left")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run with gloo (tiny --set)")
    p.add_argument("--out", type=Path, default=Path("bench-out/sharded"))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every run")
    p.add_argument("--data-cache-dir", help="where the embedded corpus is prepared (default: the config's)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gptforge-sharded-"))
    end = time.time() + args.deadline if args.deadline else None
    plan = [(model, engine, gpus) for model in args.models for engine in args.engines
            for gpus in (args.weak_scaling or [args.gpus])]
    rows = []
    for model, engine, gpus in plan:
        run = f"{model}-{engine}" + (f"-{gpus}gpu" if args.weak_scaling else "")
        left = end - time.time() if end else args.run_timeout
        if left < args.min_run_s:
            rows.append({"run": run, "engine": engine, "model": model, "gpus": gpus, "global_batch": args.per_gpu_batch * gpus,
                         "rc": f"not run: {left:.0f} s left before the deadline"})
            continue
        rows.append(run_one(run, engine, model, gpus, args.per_gpu_batch * gpus, args, work, args.out,
                            min(args.run_timeout, left)))
    if args.weak_scaling:
        few, many = args.weak_scaling

        def baseline_of(r):  # weak scaling: tokens/s over (MANY/FEW) x the same engine's on FEW GPUs
            if r["gpus"] != many:
                return None
            base = next((b for b in rows if b["engine"] == r["engine"] and b["model"] == r["model"] and b["gpus"] == few), None)
            return base and base.get("tokens_per_s") and {"tokens_per_s": base["tokens_per_s"] * many / few}
        header = f"weak scaling: ratio = tokens/s on {many} GPUs / ({many // few} x the same engine on {few})"
    else:
        def baseline_of(r):
            return next((b for b in rows if b["engine"] == "ddp" and b["model"] == r["model"] and "tokens_per_s" in b), None)
        header = "same global batch: ratio = tokens/s / DDP's"
    text = header + "\n\n" + table(rows, baseline_of)
    failures = [f"{r['run']}: {r['error']}" for r in rows if r.get("error")]
    if failures:
        text += "\n\nfailed runs (the first error of each log):\n" + "\n".join(failures)
    print("\n" + text)
    name = "scaling" if args.weak_scaling else "sharded"
    (args.out / f"{name}.md").write_text(text + "\n")
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
