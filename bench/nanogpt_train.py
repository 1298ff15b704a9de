#!/usr/bin/env python
"""nanoGPT's sustained training speed: karpathy/nanoGPT's own train.py, unmodified, on synthetic tokens.

bench.py, which bench/throughput.py runs beside gptforge, times 20 steps right after its 10 burn-in steps:
about 1.5 s of work from a GPU that idled through compilation, a burst that an H100 at its power limit
need not keep up. train.py runs as long as it is asked to, so its later iterations show the speed that a
training run keeps (for GPT-2 124M on an H100 the two agree: BENCHMARKS.md, runs 67-68). This writes WORK/data/synthetic/{train,val}.bin (random GPT-2 token ids), runs
train.py there at gptforge's shape, batch and precision (one micro batch per iteration, GPT-2's biases,
one evaluation batch at iteration 0, no checkpoint), and reads train.py's own per-iteration times
("iter N: loss L, time T ms"): their median, 10th and 90th percentiles after --skip iterations. Like
bench.py, train.py reads each iteration's loss at once; unlike it, it clips gradients (as gptforge does).

    PYTHONPATH=src python3 bench/nanogpt_train.py --nanogpt third_party/nanogpt --models gpt2-124m,gpt2-350m
    PYTHONPATH=src python3 bench/nanogpt_train.py --nanogpt DIR --device cpu --precision fp32 --models gpt2-tiny --iters 4 --skip 1
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from nanogpt_bench import DTYPES  # bench/ is this script's directory
from throughput import model_shape

NEEDS = ("train.py", "model.py", "configurator.py")
ITER_LINE = re.compile(r"^iter (\d+): loss \S+, time ([0-9.]+)ms", re.MULTILINE)
GPT2_VOCAB = 50257
SYNTHETIC_TOKENS = 1 << 21


def check_checkout(directory: Path) -> str | None:
    missing = [f for f in NEEDS if not (directory / f).is_file()]
    return f"{directory} has no {', '.join(missing)} (a karpathy/nanoGPT checkout has them)" if missing else None


def write_tokens(work: Path) -> None:
    """Random GPT-2 token ids as train.py reads them: data/synthetic/{train,val}.bin, uint16."""
    import numpy as np

    folder = work / "data" / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1337)
    for split in ("train", "val"):
        rng.integers(0, GPT2_VOCAB, SYNTHETIC_TOKENS, dtype=np.uint16).tofile(folder / f"{split}.bin")


def command(checkout: Path, shape: dict, batch: int, iters: int, device: str, precision: str, compile_: bool) -> list[str]:
    """train.py's command line, run from the work directory (so its out_dir and data are relative)."""
    return [sys.executable, str((checkout / "train.py").resolve()), "--dataset=synthetic", "--out_dir=out",
            f"--n_layer={shape['layers']}", f"--n_head={shape['heads']}", f"--n_embd={shape['width']}",
            f"--block_size={shape['seq']}", f"--batch_size={batch}", "--gradient_accumulation_steps=1", "--bias=True",
            "--dropout=0.0", f"--compile={compile_}", f"--device={device}", f"--dtype={DTYPES[precision]}",
            f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--eval_interval={iters + 1}", "--eval_iters=1",
            "--log_interval=1", "--always_save_checkpoint=False", "--wandb_log=False"]


def summary(stdout: str, skip: int, tokens_per_iter: int) -> dict:
    """train.py's per-iteration times after SKIP iterations: median, 10th and 90th percentile, tokens/s."""
    times = [float(ms) for step, ms in ITER_LINE.findall(stdout) if int(step) >= skip]
    if not times:
        return {"failed": f"train.py printed no iteration at or after {skip}"}
    ordered = sorted(times)
    median = statistics.median(ordered)
    return {"iters": len(times), "skip": skip, "ms_median": median, "ms_p10": ordered[len(ordered) // 10],
            "ms_p90": ordered[(len(ordered) * 9) // 10], "tokens_per_s": tokens_per_iter / (median / 1e3)}


def run(checkout: Path, config: str, args) -> dict:
    shape, compile_ = model_shape(config, [])
    work = Path(tempfile.mkdtemp(prefix="gptforge-nanogpt-train-"))
    try:
        write_tokens(work)
        shutil.copy(checkout / "configurator.py", work / "configurator.py")  # train.py exec()s it from its cwd
        cmd = command(checkout, shape, args.batch, args.iters, args.device, args.precision, compile_)
        try:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"model": config, "failed": f"train.py ran past {args.timeout:.0f} s"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"model": config, "failed": f"train.py exit {proc.returncode}: " + " | ".join(tail)}
    return {"model": config, "batch": args.batch, **summary(proc.stdout, args.skip, args.batch * shape["seq"]),
            "command": " ".join(["train.py", *cmd[2:]])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/nanogpt_train.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", type=Path, required=True, help="a karpathy/nanoGPT checkout (train.py, model.py, configurator.py)")
    p.add_argument("--models", default="gpt2-124m", help="comma list of packaged config names or .toml paths (their shape)")
    p.add_argument("--batch", type=int, default=32, help="sequences per iteration (one micro batch)")
    p.add_argument("--iters", type=int, default=150, help="iterations train.py runs (it runs one more)")
    p.add_argument("--skip", type=int, default=50, help="iterations left out of the figures (compilation, power ramp)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--precision", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--timeout", type=float, default=600, help="seconds per train.py run")
    p.add_argument("--json", action="store_true", help="the results as JSON on stdout")
    args = p.parse_args(argv)
    if why := check_checkout(args.nanogpt):
        print(f"nanogpt_train.py: {why}", file=sys.stderr)
        return 2
    if not 0 <= args.skip < args.iters or args.batch < 1:
        print("nanogpt_train.py: --skip must be below --iters, and --batch at least 1", file=sys.stderr)
        return 2
    results = [run(args.nanogpt, config, args) for config in args.models.split(",") if config]
    if args.json:
        print(json.dumps(results, indent=1))
    for r in results if not args.json else []:
        if "failed" in r:
            print(f"{r['model']}: {r['failed']}")
        else:
            print(f"{r['model']}: nanoGPT train.py {r['tokens_per_s']:,.0f} tok/s, {r['ms_median']:.1f} ms/iter median "
                  f"(p10 {r['ms_p10']:.1f}, p90 {r['ms_p90']:.1f}) over iterations {r['skip']}-{r['skip'] + r['iters'] - 1}")
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
