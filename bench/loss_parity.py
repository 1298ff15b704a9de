#!/usr/bin/env python
"""Loss parity: train two configurations from the same seed on the same data and compare the curves.

Both runs go through gptforge's trainer with the same config, seed, data order and step count; they
differ only in the keys of --a and --b (default: the fused loss's torch ops against its Triton kernel), or
with --a-src DIR in the source tree A is trained from too (DIR/src: e.g. the tree before a change, its own
keys in --a).
Reports the max and mean absolute difference of the per-step training losses (and over the last 10%
of steps, where a drift would show), the final validation losses, and with --repeat-a the same figures
for A against a second run of A: the run-to-run noise floor (GPU kernels with atomics are not
bit-reproducible), against which the A/B difference is to be read. --max-diff exits 1 when the A/B max
difference is above it (--max-drift: any seed's |drift|, with --seeds); a run whose keys could not apply (a
warning among the trainer's notes) also exits 1 and says which. JSON: $GPTFORGE_BENCH_OUT/loss_parity.json (or ./loss_parity.json),
rewritten after every run ("complete": false until the last), so a run cut short keeps what finished.

A same-seed pair against the A/A floor only measures perturbations of the size of GPU nondeterminism.
--seeds trains the A/B pair once per seed (seed=S added to both) to ask whether B differs from A
systematically: per seed the curve difference, the drift (mean of B - A train loss over the last half of
the steps, signed) and B - A final val loss; across seeds their mean and standard error, beside A's own
seed-to-seed spread. With --repeat-a, A is trained twice on every seed: each seed's A rerun drift (A2 - A)
is the noise floor, beside the scatter of B's drifts around zero (rms). A systematic difference shows in
the mean drift; a change of numerics scatters more than a rerun, which differs only by the order of
atomics, so the scatter alone is no verdict.
--only-b trains B alone on every seed, for bench/parity_pool.py to read against the A runs that earlier
calls trained on the same seeds, shape and data.
--jobs N trains up to N runs at once, on one GPU side by side (each run's numerics are what they would be
alone; only the wall time changes): the first starts alone and the others once its first step is logged, by
when the corpus it built and the kernels it autotuned at startup are on disk for the others to read.

The data is the embedded corpus unless --both gives every run other keys. 500 steps of 16 x 1024 tokens
read the embedded corpus about 13 times, so its training loss measures memorization; for a training loss
that is a held-out loss, give a corpus the runs read less than once (each run reports its
train_passes), e.g. bench/code_corpus.sh's: --both "$(cat DIR/keys)". The report names that corpus by
the sha256 of its .bin files ("data"), so bench/parity_pool.py pools calls that built it elsewhere.
Runs are named a@S, b@S, a2@S; the top-level a_vs_b and a_vs_a are the first seed's.

    PYTHONPATH=src python3 bench/loss_parity.py --steps 500 --repeat-a
    PYTHONPATH=src python3 bench/loss_parity.py --b accel=te-fp8 --steps 500
    PYTHONPATH=src python3 bench/loss_parity.py --a-src /tmp/before --a '' --b accel=hopper --seeds 1337,2 --jobs 4
    PYTHONPATH=src python3 bench/loss_parity.py --steps 500 --repeat-a --seeds 1337,2,3
    PYTHONPATH=src python3 bench/loss_parity.py --steps 500 --seeds 5,6,7,8 --jobs 4
    bash bench/code_corpus.sh out/code
    PYTHONPATH=src python3 bench/loss_parity.py --both "$(cat out/code/keys)" --a accel=triton --b accel=hopper --repeat-a --seeds 5,6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

# GPU defaults: GPT-2 124M at micro = global batch 16 x 1024 tokens, one eval at the end
RUN_KEYS = ["micro-batch-size={batch}", "global-batch-size={batch}", "train-iters={steps}",
            "lr-warmup-iters={warmup}", "eval-interval={steps}", "save-interval={steps}", "eval-iters=4",
            "log-interval=100", "keep-last=1"]


def curve_diff(a: list[float], b: list[float]) -> dict:
    diffs = [abs(x - y) for x, y in zip(a, b)]
    tail = diffs[len(diffs) - max(1, len(diffs) // 10):]
    return {"max_abs": max(diffs), "mean_abs": sum(diffs) / len(diffs), "tail_mean_abs": sum(tail) / len(tail)}


def last_half_mean(xs: list[float]) -> float:
    tail = xs[len(xs) // 2:]
    return sum(tail) / len(tail)


def signed_drift(a: list[float], b: list[float]) -> float:
    """Mean of (b - a) over the last half of the steps: a systematic offset shows here, noise averages out."""
    return last_half_mean(b) - last_half_mean(a)


def mean_and_stderr(xs: list[float]) -> dict:
    """Mean and standard error (sample std / sqrt(n)); None where there are too few values."""
    n = len(xs)
    mean = sum(xs) / n if n else None
    if n < 2:
        return {"mean": mean, "stderr": None}
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return {"mean": mean, "stderr": (var / n) ** 0.5}


def spread(xs: list[float]) -> float | None:
    return max(xs) - min(xs) if xs else None


def rms(xs: list[float]) -> float | None:
    """Root mean square: the scatter of drifts around zero, what no systematic offset would leave."""
    return (sum(x * x for x in xs) / len(xs)) ** 0.5 if xs else None


def parse_seeds(text: str | None) -> list[int]:
    """--seeds as a list (empty when not given); UsageError with the one-line problem."""
    from gptforge.errors import UsageError
    from gptforge.train.config import check_seed

    if text is None:
        return []
    seeds = []
    for item in text.split(","):
        try:
            seed = int(item)
        except ValueError:
            raise UsageError("--seeds", f"{item!r} is not a whole number") from None
        check_seed(seed, "--seeds")
        if seed in seeds:
            raise UsageError("--seeds", f"{seed} is given twice")
        seeds.append(seed)
    return seeds


def sets_seed(keys: list[str]) -> bool:
    """Whether KEYS (already valid) set the seed, as the trainer reads them ("optim.seed" is "seed" too)."""
    from gptforge.train.config import parse_override

    return any(parse_override(k)[0] == "seed" for k in keys)


class RunFailed(Exception):
    """A training run exited non-zero: the message is its keys and the last line it printed."""


def data_identity(keys: list[str]) -> dict | None:
    """The sha256 of each .bin the data-path key among KEYS names: the same corpus, wherever it was built."""
    import hashlib

    from gptforge.train.config import parse_override

    paths = [value for key, value in map(parse_override, keys) if key == "data-path"]
    if not paths:
        return None
    digests = {}
    for prefix in (p for p in paths[-1] if Path(f"{p}.bin").is_file()):  # a blend's weights name no file
        with open(f"{prefix}.bin", "rb") as f:
            digests[Path(prefix).name] = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bin_sha256": digests}


def config_values(config: str) -> dict:
    """Every key of CONFIG as the trainer resolves it before any run's keys: what the runs' own keys are read
    against, so a report says which defaults "--a fused-loss=true" stood on when it was made."""
    from gptforge.train.config import load_config

    return load_config(config)[0].to_dict()


def train_once(config: str, keys: list[str], run_dir: Path, device: str, src: Path | None = None) -> dict:
    """One training run in its own process, as a user would start it: nothing (compiled graphs, a library
    left half-imported) carries over from one run into the next. SRC: the gptforge source tree it runs."""
    from gptforge.train.metrics import read_records

    cmd = [sys.executable, "-m", "gptforge", "train", "--config", config, "--run-dir", str(run_dir),
           "--device", device, "--json", *keys]
    env = None if src is None else {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "src"),
                                                                                  os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RunFailed(f"the run with {' '.join(keys[-3:])} exited {proc.returncode}: {last}")
    result = json.loads(proc.stdout)
    losses = [r["loss"] for r in read_records(run_dir / "metrics.jsonl", "train")]
    return {"keys": keys, "losses": losses, "final_val_loss": result["final_val_loss"], "notes": result["notes"],
            "train_passes": result["train_passes"]}


def fallbacks(runs: dict) -> dict:
    """run name -> the trainer's warnings: notes saying the run is not quite what its keys asked for."""
    found = {name: [n["message"] if isinstance(n, dict) else n for n in run["notes"]
                    # a tree from before the notes had codes (--a-src) says "asked for" in its plain-text warnings
                    if (n["severity"] == "warning" if isinstance(n, dict) else "asked for" in n)] for name, run in runs.items()}
    return {name: notes for name, notes in found.items() if notes}


def plan(a: list[str], b: list[str], seeds: list[int], repeat_a: bool, only_b: bool = False) -> list[tuple[str, list[str]]]:
    """(run name, its own keys) in training order; without seeds the names carry no @S; ONLY_B: no A runs."""
    plans = []
    for seed in seeds or [None]:
        at, extra = ("", []) if seed is None else (f"@{seed}", [f"seed={seed}"])
        plans += ([] if only_b else [("a" + at, a + extra)]) + [("b" + at, b + extra)]
        if repeat_a:
            plans.append(("a2" + at, a + extra))
    return plans


def seed_rows(seeds: list[int], runs: dict) -> list[dict]:
    """One row per seed whose A and B both finished; with A's rerun, its drift from A too (the noise floor)."""
    rows = []
    for seed in seeds:
        a, b, a2 = runs.get(f"a@{seed}"), runs.get(f"b@{seed}"), runs.get(f"a2@{seed}")
        if a and b:
            rows.append({"seed": seed, "a_vs_b": curve_diff(a["losses"], b["losses"]),
                         "drift": signed_drift(a["losses"], b["losses"]),
                         "val_diff": b["final_val_loss"] - a["final_val_loss"],
                         "aa_drift": signed_drift(a["losses"], a2["losses"]) if a2 else None})
    return rows


def seed_summary(rows: list[dict], runs: dict) -> dict:
    a_runs = [runs[f"a@{row['seed']}"] for row in rows]
    drifts = [row["drift"] for row in rows]
    aa = [row["aa_drift"] for row in rows if row["aa_drift"] is not None]
    return {"n": len(rows), "drift": mean_and_stderr(drifts), "aa_drift": mean_and_stderr(aa),
            "rms": {"drift": rms(drifts), "aa_drift": rms(aa), "aa_runs": len(aa)},
            "val_diff": mean_and_stderr([row["val_diff"] for row in rows]),
            "a_spread": {"val": spread([r["final_val_loss"] for r in a_runs]),
                         "train": spread([last_half_mean(r["losses"]) for r in a_runs])}}


def build_report(args, common: list[str], seeds: list[int], runs: dict, complete: bool) -> dict:
    """The report of the runs finished so far."""
    report = {"config": args.config, "config_values": args.config_values, "a_src": args.a_src and str(args.a_src),
              "steps": args.steps, "batch": args.batch,
              "common": common, "runs": runs, "complete": complete, "fallbacks": fallbacks(runs), "data": args.data}
    at = f"@{seeds[0]}" if seeds else ""
    for label, other in (("a_vs_b", "b"), ("a_vs_a", "a2")):
        if "a" + at in runs and other + at in runs:
            report[label] = curve_diff(runs["a" + at]["losses"], runs[other + at]["losses"])
    if seeds:
        rows = seed_rows(seeds, runs)
        report.update(seed_list=seeds, seeds=rows, seed_summary=seed_summary(rows, runs))
    return report


def progress(name: str, i: int, total: int) -> str:
    arm, _, seed = name.partition("@")
    return f"{f'seed {seed}: ' if seed else ''}training {arm} ({i}/{total})"


def parity(args, save) -> dict:
    """Trains the plan, calling save(report) before the first run and after each one; returns the last report."""
    common = [k.format(batch=args.batch, steps=args.steps, warmup=max(1, args.steps // 10)) for k in RUN_KEYS] + args.both
    seeds = parse_seeds(args.seeds)
    args.data = data_identity(args.both)
    args.config_values = config_values(args.config)
    work = Path(tempfile.mkdtemp(prefix="gptforge-parity-"))
    cache = f"data-cache-dir={work / 'data'}"
    plans = plan(args.a, args.b, seeds, args.repeat_a, args.only_b)
    finished: dict = {}

    def report() -> dict:  # the runs in plan order, whichever order they finished in
        runs = {name: finished[name] for name, _ in plans if name in finished}
        return build_report(args, common, seeds, runs, complete=len(runs) == len(plans))

    def train(keys: list[str], run_dir: Path) -> dict:
        other_tree = {"src": args.a_src} if args.a_src and run_dir.name.startswith("a") else {}  # a@S, a2@S
        return train_once(args.config, common + [cache] + keys, run_dir, args.device, **other_tree)

    # written before the first run too, so a stale file from an earlier invocation never reads as this one's
    save(report())
    try:
        for name, result in train_all(plans, train, work, args.jobs):
            finished[name] = result
            save(report())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report()


def train_all(plans: list[tuple[str, list[str]]], train, work: Path, jobs: int):
    """(name, result) of each planned run as it finishes, up to JOBS at a time; after a failure no further run
    starts, the ones running finish, and the failure is raised."""
    pending = list(enumerate(plans, 1))

    def start(pool: ThreadPoolExecutor) -> tuple[Future, str]:
        i, (name, keys) = pending.pop(0)
        print(progress(name, i, len(plans)), file=sys.stderr, flush=True)
        return pool.submit(train, keys, work / name), name

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        first, name = start(pool)
        running = {first: name}
        if jobs > 1:
            wait_for_first_step(work / name, first)
        while running or pending:
            while pending and len(running) < jobs:
                future, name = start(pool)
                running[future] = name
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                if future.exception() is not None:
                    wait(running)
                    raise future.exception()
                yield name, future.result()


def wait_for_first_step(run_dir: Path, run: Future, poll_s: float = 0.5) -> None:
    """Until RUN has logged a training step (its startup, compiling and autotuning, is behind it) or ended."""
    metrics = run_dir / "metrics.jsonl"
    while not run.done() and not (metrics.is_file() and '"train"' in metrics.read_text()):
        time.sleep(poll_s)


def show(report: dict) -> None:
    runs, seeds = report["runs"], report.get("seed_list")
    pairing = (f"A and B paired on each of seeds {', '.join(map(str, seeds))} (a vs b, a vs a: seed {seeds[0]})"
               if seeds else "same seed and data order")
    print(f"{report['config']}, {report['steps']} steps of batch {report['batch']}, {pairing}")
    for name, run in runs.items():
        print(f"  {name}: {' '.join(run['keys'][len(report['common']) + 1:]) or '(config as is)'}; final train loss "
              f"{run['losses'][-1]:.4f}, final val loss {run['final_val_loss']:.4f}{passes_text(run)}")
    for label in ("a_vs_b", "a_vs_a"):
        if label in report:
            d = report[label]
            print(f"  {label.replace('_', ' ')}: max |diff| {d['max_abs']:.4g}, mean {d['mean_abs']:.4g}, "
                  f"mean over the last 10% {d['tail_mean_abs']:.4g}")
    if seeds and report["seeds"]:
        show_seeds(report["seeds"], report["seed_summary"])
    elif seeds:
        print("  no A runs here: pool these B runs with A runs of the same seeds, shape and data from other calls "
              "(bench/parity_pool.py)")


def passes_text(run: dict) -> str:
    """How often the run read its training split, where the run reports it (reports before it did not)."""
    passes = run.get("train_passes")
    return "" if passes is None else f", {passes:.2f} passes over the training split"


def num(x: float | None, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def show_seeds(rows: list[dict], summary: dict) -> None:
    for row in rows:
        rerun = "" if row["aa_drift"] is None else f", A's rerun drift {row['aa_drift']:+.3g}"
        print(f"  seed {row['seed']}: a vs b max |diff| {row['a_vs_b']['max_abs']:.4g}, "
              f"drift (b-a, last half) {row['drift']:+.3g}, val b-a {row['val_diff']:+.3g}{rerun}")
    drift, val, a = summary["drift"], summary["val_diff"], summary["a_spread"]
    print(f"  across {summary['n']} seeds: drift mean {num(drift['mean'], '+.3g')} ± {num(drift['stderr'])} (s.e.), "
          f"val b-a mean {num(val['mean'], '+.3g')} ± {num(val['stderr'])}; "
          f"A's own seed spread: val {num(a['val'])}, train {num(a['train'])}")
    scatter = summary["rms"]
    if scatter["aa_runs"]:
        print(f"  scatter around zero (rms): drift {num(scatter['drift'])}, A's rerun drift {num(scatter['aa_drift'])} "
              f"over {scatter['aa_runs']} seeds (an offset shows in the mean drift; a change of numerics scatters more "
              "than a rerun)")


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="gpt2-124m")
    p.add_argument("--a", default="accel=none", help="comma list of config keys of run A")
    p.add_argument("--b", default="accel=triton", help="comma list of config keys of run B")
    p.add_argument("--a-src", type=Path, default=None, metavar="DIR",
                   help="train A from the gptforge source tree DIR/src (its keys checked by that tree)")
    p.add_argument("--both", default="", metavar="KEYS",
                   help="comma list of config keys given to every run, e.g. the data: "
                        "data-path=PREFIX,tokenizer-type=gpt2 (default: the embedded corpus)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=16, help="sequences per step (micro = global)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--repeat-a", action="store_true",
                   help="train A twice (on every seed, with --seeds): the run-to-run noise floor")
    p.add_argument("--only-b", action="store_true",
                   help="with --seeds: train only B on every seed, for bench/parity_pool.py to read against the A "
                        "runs of earlier calls on the same seeds, shape and data (half the device time)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="train up to N runs at once (on one GPU side by side; the first alone until its first step is "
                        "logged, so that the others find its autotuned kernels on disk)")
    p.add_argument("--max-diff", type=float, default=None, help="exit 1 when the A/B max |loss diff| is above this")
    p.add_argument("--max-drift", type=float, default=None,
                   help="with --seeds: exit 1 when any seed's |drift| (mean B - A over the last half) is above this")
    p.add_argument("--seeds", default=None, metavar="S1,S2,...",
                   help="comma list of seeds: train the A/B pair once per seed (seed=S) and report the drift of B "
                        "from A across seeds; the top-level diffs are the first seed's")
    args = p.parse_args(argv)
    args.a = [k for k in args.a.split(",") if k]
    args.b = [k for k in args.b.split(",") if k]
    args.both = [k for k in args.both.split(",") if k]
    return args


def check(args) -> str | None:
    """Every key and value checked before training: None, or the one-line problem."""
    from gptforge.errors import UsageError
    from gptforge.train.config import load_config, validate

    if args.steps < 2 or args.batch < 1:
        return "--steps must be >= 2 and --batch >= 1"
    if args.jobs < 1:
        return "--jobs must be >= 1"
    if args.a_src and not (args.a_src / "src" / "gptforge").is_dir():
        return f"--a-src: {args.a_src} holds no src/gptforge"
    try:
        seeds = parse_seeds(args.seeds)
        for keys in (args.b,) if args.a_src else (args.a, args.b):
            validate(load_config(args.config, args.both + keys + [f"train-iters={args.steps}", f"lr-warmup-iters={max(1, args.steps // 10)}",
                                                      f"micro-batch-size={args.batch}", f"global-batch-size={args.batch}"])[0])
    except UsageError as err:
        return err.one_line()
    if seeds and (sets_seed(args.a) or sets_seed(args.b) or sets_seed(args.both)):
        return "--seeds sets seed=S on both runs: drop seed from --a, --b and --both"
    if args.max_drift is not None and not seeds:
        return "--max-drift reads the per-seed drift: give --seeds too"
    if args.only_b and not seeds:
        return "--only-b trains B for pooling per seed: give --seeds too"
    if args.only_b and (args.repeat_a or args.max_diff is not None or args.max_drift is not None):
        return "--only-b trains no A: drop --repeat-a, --max-diff and --max-drift (bench/parity_pool.py compares)"
    return None


def main(argv: list[str] | None = None) -> int:
    from gptforge.storage import write_atomic

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if problem := check(args):
        print(f"loss_parity.py: {problem}", file=sys.stderr)
        return 2
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "loss_parity.json"
    try:
        report = parity(args, lambda r: write_atomic(path, json.dumps(r, indent=2).encode()))
    except RunFailed as err:
        print(f"loss_parity.py: {err} (runs finished so far: {path})", file=sys.stderr)
        return 1
    show(report)
    print(f"JSON: {path}")
    for name, notes in report["fallbacks"].items():
        print(f"loss_parity.py: run {name} is not what was asked: {'; '.join(notes)}", file=sys.stderr)
    if report["fallbacks"]:
        return 1
    if args.max_diff is not None and report["a_vs_b"]["max_abs"] > args.max_diff:
        print(f"A/B max |loss diff| {report['a_vs_b']['max_abs']:.4g} is above --max-diff {args.max_diff}")
        return 1
    if args.max_drift is not None and (over := drifts_over(report["seeds"], args.max_drift)):
        print(f"drift above --max-drift {args.max_drift}: " + ", ".join(f"seed {s} {d:+.4g}" for s, d in over))
        return 1
    return 0


def drifts_over(rows: list[dict], limit: float) -> list[tuple[int, float]]:
    """(seed, drift) of every seed whose |drift| is above LIMIT."""
    return [(row["seed"], row["drift"]) for row in rows if abs(row["drift"]) > limit]


if __name__ == "__main__":
    raise SystemExit(main())
