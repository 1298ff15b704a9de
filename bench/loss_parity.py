#!/usr/bin/env python
"""Loss parity: train two configurations from the same seed on the embedded corpus and compare the curves.

Both runs go through gptforge's trainer with the same config, seed, data order and step count; they
differ only in the keys of --a and --b (default: the reference loss against the fused chunked one).
Reports the max and mean absolute difference of the per-step training losses (and over the last 10%
of steps, where a drift would show), the final validation losses, and with --repeat-a the same figures
for A against a second run of A: the run-to-run noise floor (GPU kernels with atomics are not
bit-reproducible), against which the A/B difference is to be read. --max-diff exits 1 when the A/B max
difference is above it; a run whose keys could not apply (the trainer's "asked for but" notes: a library
missing, a GPU without FP8) also exits 1 and says which. JSON: $GPTFORGE_BENCH_OUT/loss_parity.json (or ./loss_parity.json).

    PYTHONPATH=src python3 bench/loss_parity.py --steps 500 --repeat-a
    PYTHONPATH=src python3 bench/loss_parity.py --b transformer-engine=true,fp8=true --steps 500
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# GPU defaults: GPT-2 124M at micro = global batch 16 x 1024 tokens, one eval at the end
RUN_KEYS = ["micro-batch-size={batch}", "global-batch-size={batch}", "train-iters={steps}",
            "lr-warmup-iters={warmup}", "eval-interval={steps}", "save-interval={steps}", "eval-iters=4",
            "log-interval=100", "keep-last=1"]


def curve_diff(a: list[float], b: list[float]) -> dict:
    diffs = [abs(x - y) for x, y in zip(a, b)]
    tail = diffs[len(diffs) - max(1, len(diffs) // 10):]
    return {"max_abs": max(diffs), "mean_abs": sum(diffs) / len(diffs), "tail_mean_abs": sum(tail) / len(tail)}


class RunFailed(Exception):
    """A training run exited non-zero: the message is its keys and the last line it printed."""


def train_once(config: str, keys: list[str], run_dir: Path, device: str) -> dict:
    """One training run in its own process, as a user would start it: nothing (compiled graphs, a library
    left half-imported) carries over from one run into the next."""
    from gptforge.train.metrics import read_records

    cmd = [sys.executable, "-m", "gptforge", "train", "--config", config, "--run-dir", str(run_dir),
           "--device", device, "--json", *keys]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RunFailed(f"the run with {' '.join(keys[-3:])} exited {proc.returncode}: {last}")
    result = json.loads(proc.stdout)
    losses = [r["loss"] for r in read_records(run_dir / "metrics.jsonl", "train")]
    return {"keys": keys, "losses": losses, "final_val_loss": result["final_val_loss"], "notes": result["notes"]}


def fallbacks(runs: dict) -> dict:
    """run name -> the trainer's notes saying a key asked for could not apply (the run is not what was asked)."""
    found = {name: [n for n in run["notes"] if "asked for but" in n] for name, run in runs.items()}
    return {name: notes for name, notes in found.items() if notes}


def parity(args) -> dict:
    common = [k.format(batch=args.batch, steps=args.steps, warmup=max(1, args.steps // 10)) for k in RUN_KEYS]
    work = Path(tempfile.mkdtemp(prefix="gptforge-parity-"))
    common.append(f"data-cache-dir={work / 'data'}")
    try:
        runs = {"a": train_once(args.config, common + args.a, work / "a", args.device),
                "b": train_once(args.config, common + args.b, work / "b", args.device)}
        if args.repeat_a:
            runs["a2"] = train_once(args.config, common + args.a, work / "a2", args.device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"config": args.config, "steps": args.steps, "batch": args.batch, "common": common[:-1], "runs": runs,
              "a_vs_b": curve_diff(runs["a"]["losses"], runs["b"]["losses"]), "fallbacks": fallbacks(runs)}
    if args.repeat_a:
        report["a_vs_a"] = curve_diff(runs["a"]["losses"], runs["a2"]["losses"])
    return report


def show(report: dict) -> None:
    runs = report["runs"]
    print(f"{report['config']}, {report['steps']} steps of batch {report['batch']}, same seed and data order")
    for name, run in runs.items():
        print(f"  {name}: {' '.join(run['keys'][len(report['common']) + 1:]) or '(config as is)'}; final train loss "
              f"{run['losses'][-1]:.4f}, final val loss {run['final_val_loss']:.4f}")
    for label in ("a_vs_b", "a_vs_a"):
        if label in report:
            d = report[label]
            print(f"  {label.replace('_', ' ')}: max |diff| {d['max_abs']:.4g}, mean {d['mean_abs']:.4g}, "
                  f"mean over the last 10% {d['tail_mean_abs']:.4g}")


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="gpt2-124m")
    p.add_argument("--a", default="fused-loss=false", help="comma list of config keys of run A")
    p.add_argument("--b", default="fused-loss=true", help="comma list of config keys of run B")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=16, help="sequences per step (micro = global)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--repeat-a", action="store_true", help="train A twice: the run-to-run noise floor")
    p.add_argument("--max-diff", type=float, default=None, help="exit 1 when the A/B max |loss diff| is above this")
    args = p.parse_args(argv)
    args.a = [k for k in args.a.split(",") if k]
    args.b = [k for k in args.b.split(",") if k]
    return args


def check(args) -> str | None:
    """Every key and value checked before training: None, or the one-line problem."""
    from gptforge.errors import UsageError
    from gptforge.train.config import load_config, validate

    if args.steps < 2 or args.batch < 1:
        return "--steps must be >= 2 and --batch >= 1"
    try:
        for keys in (args.a, args.b):
            validate(load_config(args.config, keys + [f"train-iters={args.steps}", f"lr-warmup-iters={max(1, args.steps // 10)}",
                                                      f"micro-batch-size={args.batch}", f"global-batch-size={args.batch}"])[0])
    except UsageError as err:
        return err.one_line()
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if problem := check(args):
        print(f"loss_parity.py: {problem}", file=sys.stderr)
        return 2
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = parity(args)
    except RunFailed as err:
        print(f"loss_parity.py: {err}", file=sys.stderr)
        return 1
    path = out / "loss_parity.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)
    show(report)
    print(f"JSON: {path}")
    for name, notes in report["fallbacks"].items():
        print(f"loss_parity.py: run {name} is not what was asked: {'; '.join(notes)}", file=sys.stderr)
    if report["fallbacks"]:
        return 1
    if args.max_diff is not None and report["a_vs_b"]["max_abs"] > args.max_diff:
        print(f"A/B max |loss diff| {report['a_vs_b']['max_abs']:.4g} is above --max-diff {args.max_diff}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
