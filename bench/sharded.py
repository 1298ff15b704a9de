"""Sharded engines against DDP on one host, at the same global batch: tokens/s, the ratio to DDP, peak memory.

Each run is `gptforge train` under torchrun on the embedded corpus (prepared once, cached), the same model
and micro batch for every engine; DeepSpeed runs take a config from VARIANTS (the packaged zero*.json with
the changes named). Tokens/s is the median over the steps after --warmup (compilation, allocator growth);
peak memory is the largest per-step reading of torch.cuda.max_memory_allocated on rank 0.

    python3 bench/sharded.py --gpus 2 --models 124m 350m --engines ddp fsdp zero2 zero3
    python3 bench/sharded.py --weak-scaling 1 4 --models 124m --engines ddp fsdp

Writes OUT/sharded.json and OUT/sharded.md (the table; scaling.* for weak scaling) and OUT/<run>.log; prints
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# DeepSpeed variants: the packaged config of the stage with these changes
VARIANTS = {
    "zero2": ("zero2", {}),
    "zero2-eager": ("zero2", {"_compile": False}),
    "zero2-bucket2e8": ("zero2", {"zero_optimization": {"reduce_bucket_size": 200_000_000,
                                                        "allgather_bucket_size": 200_000_000}}),
    "zero2-deepcompile": ("zero2", {"compile": {"deepcompile": True}}),
    "zero3": ("zero3", {}),
    "zero3-deepcompile": ("zero3", {"compile": {"deepcompile": True}}),
    "zero3-prefetch": ("zero3", {"zero_optimization": {"stage3_prefetch_bucket_size": 200_000_000,
                                                       "stage3_param_persistence_threshold": 1_000_000,
                                                       "reduce_bucket_size": 200_000_000}}),
}


def merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def deepspeed_config(name: str, work: Path) -> tuple[Path, bool]:
    stage, changes = VARIANTS[name]
    packaged = resources.files("gptforge") / "configs" / "deepspeed" / f"{stage}.json"
    changes = dict(changes)
    compiled = changes.pop("_compile", True)
    path = work / f"{name}.json"
    path.write_text(json.dumps(merged(json.loads(packaged.read_text()), changes), indent=1))
    return path, compiled


def command(engine: str, model: str, gpus: int, global_batch: int, args, work: Path, run_dir: Path) -> list[str]:
    overrides = [f"train-iters={args.steps}", "lr-warmup-iters=10", f"micro-batch-size={args.micro}",
                 f"global-batch-size={global_batch}", "eval-interval=1000000", "eval-iters=1",
                 "save-interval=1000000", "log-interval=10", "compile=true"]
    if args.data_cache_dir:
        overrides.insert(0, f"data-cache-dir={args.data_cache_dir}")
    cli = ["-m", "gptforge", "train", "--config", f"gpt2-{model}", "--run-dir", str(run_dir)]
    if engine in ("fsdp", "fsdp-model"):
        cli += ["--fsdp", "--fsdp-unit", "model" if engine == "fsdp-model" else "block"]
    elif engine.startswith("zero"):
        path, compiled = deepspeed_config(engine, work)
        cli += ["--deepspeed", str(path)]
        overrides[-1] = f"compile={str(compiled).lower()}"
    elif engine != "ddp":
        raise SystemExit(f"unknown engine {engine!r}: ddp, fsdp, fsdp-model or one of {', '.join(VARIANTS)}")
    overrides += args.set
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]
    return launcher + cli + overrides


def first_gpus(n: int) -> str:
    """The first N of the GPUs this process may use (CUDA_VISIBLE_DEVICES, else all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ",".join(visible.split(",")[:n] if visible else map(str, range(n)))


def measure(run_dir: Path, warmup: int) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train" and r["step"] > warmup]
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in train),
            "step_ms": statistics.median(r["step_ms"] for r in train),
            "peak_mem_gib": max(r["mem_gib"] for r in train), "steps_timed": len(train),
            "last_loss": train[-1]["loss"]}


def run_one(name: str, engine: str, model: str, gpus: int, global_batch: int, args, work: Path, out: Path) -> dict:
    run_dir = work / name
    cmd = command(engine, model, gpus, global_batch, args, work, run_dir)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"), "CUDA_VISIBLE_DEVICES": first_gpus(gpus)}
    t0 = time.time()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:  # torchrun and its workers go together, freeing the GPUs
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    row = {"run": name, "engine": engine, "model": model, "gpus": gpus, "global_batch": global_batch,
           "micro_batch": args.micro, "wall_s": round(time.time() - t0, 1), "rc": rc}
    if rc == 0:
        row.update(measure(run_dir, args.warmup))
    else:
        row["error"] = (out / f"{name}.log").read_text()[-1500:]
    print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
    return row


def table(rows: list[dict], baseline_of) -> str:
    lines = ["| model | engine | GPUs | global batch | tokens/s (median) | ratio | peak GiB/GPU | last loss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["rc"] != 0:
            lines.append(f"| {r['model']} | {r['engine']} | {r['gpus']} | {r['global_batch']} | failed ({r['rc']}) | | | |")
            continue
        base = baseline_of(r)
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}" if base and base.get("tokens_per_s") else "n/a"
        lines.append(f"| {r['model']} | {r['engine']} | {r['gpus']} | {r['global_batch']} | {r['tokens_per_s']:,.0f} | "
                     f"{ratio} | {r['peak_mem_gib']:.2f} | {r['last_loss']:.4f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["124m"], help="packaged gpt2-* configs")
    p.add_argument("--engines", nargs="+", default=["ddp", "fsdp", "zero2", "zero3"])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--weak-scaling", nargs=2, type=int, metavar=("FEW", "MANY"),
                   help="each engine on FEW and on MANY GPUs, global batch growing with the GPUs")
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--per-gpu-batch", type=int, default=32, help="samples per GPU per step (global batch / GPUs)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--run-timeout", type=int, default=300)
    p.add_argument("--out", type=Path, default=Path("bench-out/sharded"))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every run")
    p.add_argument("--data-cache-dir", help="where the embedded corpus is prepared (default: the config's)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gptforge-sharded-"))
    rows = []
    for model in args.models:
        for engine in args.engines:
            if args.weak_scaling:
                for gpus in args.weak_scaling:
                    rows.append(run_one(f"{model}-{engine}-{gpus}gpu", engine, model, gpus, args.per_gpu_batch * gpus,
                                        args, work, args.out))
            else:
                rows.append(run_one(f"{model}-{engine}", engine, model, args.gpus, args.per_gpu_batch * args.gpus,
                                    args, work, args.out))
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
            return next((b for b in rows if b["engine"] == "ddp" and b["model"] == r["model"] and b["rc"] == 0), None)
        header = "same global batch: ratio = tokens/s / DDP's"
    text = header + "\n\n" + table(rows, baseline_of)
    print("\n" + text)
    name = "scaling" if args.weak_scaling else "sharded"
    (args.out / f"{name}.md").write_text(text + "\n")
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
