#!/usr/bin/env python
"""Loss parity pooled over calls: each run's drift against the mean of its seed's A runs from every file.

One `bench/loss_parity.py --seeds` call trains A and B once per seed on one machine, but the same
configuration's runs on different machines differ more than a pair within one call. This reads the
loss_parity.json files of several calls, takes as A every run whose own keys (its keys less the shared
run keys, the data cache and the seed) are exactly --a, and prints, for every other run, its drift (mean
of B - mean of A training loss over the last half of the steps, signed) against the mean of its seed's
A runs, beside the drift against its own call's A; per seed the A runs' spread (the largest difference
of two A runs' last-half means) and, over every seed, A's run-to-run standard deviation; per configuration
the mean, standard error and root mean square of its drifts (an offset shows in the mean; a change of
numerics scatters more than a rerun, which differs only by the order of atomics), and its final
validation loss against A's. With
--versus, every configuration's mean drift is also read against that configuration's: the difference and
its standard error (the two standard errors combined), i.e. what a lever added on top of it moves.

    python3 bench/parity_pool.py --a fused-loss=true bench/results/loss_parity/*.json
    python3 bench/parity_pool.py --a fused-loss=true --json bench/results/loss_parity/*.json
    python3 bench/parity_pool.py --a fused-loss=true --versus fused-loss=true,bf16-residual=true FILES
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from loss_parity import last_half_mean, mean_and_stderr, rms, spread  # bench/ is this script's directory


class BadInput(Exception):
    """A file that cannot be pooled: the message says which and why."""


def own_keys(run: dict, common: list[str]) -> tuple[tuple[str, ...], int | None]:
    """(the run's configuration keys, its seed): what is left of its keys after the shared ones."""
    keys = run["keys"][len(common):]
    seed = next((int(k.split("=", 1)[1]) for k in keys if k.startswith("seed=")), None)
    config = tuple(k for k in keys if not k.startswith(("seed=", "data-cache-dir=")))
    return config, seed


def run_row(path: Path, name: str, run: dict, common: list[str]) -> dict:
    config, seed = own_keys(run, common)
    return {"file": str(path), "name": name, "config": config, "seed": seed, "tail": last_half_mean(run["losses"]),
            "val": run["final_val_loss"]}


def shared_keys(report: dict) -> tuple[str, ...]:
    """The keys every run of REPORT was given; where the report names its data by content, the data's
    hashes stand for the data-path key (the same corpus built in another directory is the same data)."""
    data = report.get("data")
    if not data:
        return tuple(report["common"])
    keys = tuple(k for k in report["common"] if not k.startswith("data-path="))
    return keys + tuple(f"data {name} sha256={digest}" for name, digest in sorted(data["bin_sha256"].items()))


def load_runs(paths: list[Path]) -> list[dict]:
    """Every finished run of every file, as {file, name, config, seed, tail, val}; all files of one shape and
    with the same keys given to every run (the same data, among them)."""
    runs, shape = [], None
    for path in paths:
        try:
            report = json.loads(path.read_text())
            this = (report["config"], report["steps"], report["batch"], shared_keys(report))
            found = [run_row(path, name, run, report["common"]) for name, run in report["runs"].items()]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
            raise BadInput(f"{path}: not a loss_parity.py report ({type(e).__name__}: {e})") from None
        if shape is None:
            shape, first_values = this, report.get("config_values")
        elif this[:3] != shape[:3]:
            raise BadInput(f"{path}: {this[0]}, {this[1]} steps of batch {this[2]}, where the first file has "
                           f"{shape[0]}, {shape[1]} steps of batch {shape[2]}: pool runs of one shape")
        elif report.get("config_values") != first_values:
            raise BadInput(f"{path}: its config's defaults differ from the first file's ({config_change(first_values, report.get('config_values'))}): "
                           "the same own keys would name other runs; pool reports made with one config")
        elif this != shape:
            differ = sorted(set(this[3]) ^ set(shape[3]))
            raise BadInput(f"{path}: its runs share other keys than the first file's ({' '.join(differ)}): "
                           "pool runs of the same data and shared keys")
        runs += found
    return runs


def config_change(first: dict | None, other: dict | None) -> str:
    """How two reports' config values differ; reports made before they were recorded have none."""
    from gptforge.train.rundir import value_changes

    if first is None or other is None:
        return "one of them was made before reports recorded their config's values"
    return ", ".join(value_changes(first, other)) or "their configs hold other keys"


def pool(runs: list[dict], a: tuple[str, ...]) -> dict:
    """Per seed the A runs' mean and spread; per other run its drifts; per other configuration their summary."""
    a_tails, a_vals = {}, {}
    for run in runs:
        if run["config"] == a:
            a_tails.setdefault(run["seed"], []).append(run["tail"])
            a_vals.setdefault(run["seed"], []).append(run["val"])
    seeds = {seed: {"a_runs": len(tails), "a_mean": sum(tails) / len(tails), "a_spread": spread(tails),
                    "a_val_mean": sum(a_vals[seed]) / len(tails)}
             for seed, tails in sorted(a_tails.items(), key=lambda kv: str(kv[0]))}
    noise = a_noise(a_tails)
    rows = []
    for run in runs:
        if run["config"] == a:
            continue
        own_a = [r["tail"] for r in runs if r["file"] == run["file"] and r["config"] == a and r["seed"] == run["seed"]]
        pooled = seeds.get(run["seed"])
        rows.append({"file": run["file"], "name": run["name"], "config": list(run["config"]), "seed": run["seed"],
                     "drift": None if pooled is None else run["tail"] - pooled["a_mean"],
                     "val_diff": None if pooled is None else run["val"] - pooled["a_val_mean"],
                     "drift_own_a": run["tail"] - own_a[0] if own_a else None})
    configs: dict = {}
    for row in rows:
        if row["drift"] is not None:
            configs.setdefault(" ".join(row["config"]), []).append(row)
    summary = {config: {"runs": len(c), **mean_and_stderr([r["drift"] for r in c]), "rms": rms([r["drift"] for r in c]),
                        "val_diff": mean_and_stderr([r["val_diff"] for r in c])} for config, c in configs.items()}
    return {"a": list(a), "seeds": {str(s): v for s, v in seeds.items()}, "noise": noise, "runs": rows, "configs": summary}


def a_noise(a_tails: dict) -> dict:
    """A's run-to-run standard deviation within a seed, pooled over the seeds A ran on more than once
    (None without reruns), with its degrees of freedom: how far a rerun of the same configuration lands."""
    squares = sum((t - sum(ts) / len(ts)) ** 2 for ts in a_tails.values() for t in ts)
    dof = sum(len(ts) - 1 for ts in a_tails.values())
    return {"sd": (squares / dof) ** 0.5 if dof else None, "dof": dof}


def versus(configs: dict, reference: tuple[str, ...]) -> dict:
    """Each other configuration's mean drift less REFERENCE's, with the standard error of that difference."""
    name = " ".join(reference)
    if name not in configs:
        raise BadInput(f"--versus {','.join(reference)}: no pooled run has exactly these own keys")
    base = configs[name]
    rows = {}
    for config, s in configs.items():
        if config == name:
            continue
        known = s["stderr"] is not None and base["stderr"] is not None
        rows[config] = {"difference": s["mean"] - base["mean"],
                        "stderr": math.hypot(s["stderr"], base["stderr"]) if known else None}
    return {"config": list(reference), "differences": rows}


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.4f}"


def err(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def show(result: dict) -> None:
    print(f"A ({' '.join(result['a']) or 'the config as is'}) per seed: runs, last-half mean, spread")
    for seed, s in result["seeds"].items():
        print(f"  seed {seed}: {s['a_runs']} runs, {s['a_mean']:.4f}, spread {s['a_spread']:.4f}")
    print("drift of each other run against its seed's pooled A (against its own call's A)")
    for row in result["runs"]:
        print(f"  {row['file']} {row['name']}: {fmt(row['drift'])} ({fmt(row['drift_own_a'])})  {' '.join(row['config'])}")
    noise = result["noise"]
    if noise["sd"] is not None:
        print(f"A's run-to-run standard deviation within a seed: {noise['sd']:.4f} ({noise['dof']} degrees of freedom)")
    print("per configuration: runs, mean drift ± standard error, rms drift; final validation loss against A's")
    for config, s in result["configs"].items():
        print(f"  {s['runs']} runs, {fmt(s['mean'])} ± {err(s['stderr'])}, rms {s['rms']:.4f}; "
              f"val {fmt(s['val_diff']['mean'])} ± {err(s['val_diff']['stderr'])}  {config}")
    if "versus" in result:
        print(f"per configuration against {' '.join(result['versus']['config'])}: difference of mean drifts ± standard error")
        for config, d in result["versus"]["differences"].items():
            print(f"  {fmt(d['difference'])} ± {err(d['stderr'])}  {config}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/parity_pool.py", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="loss_parity.json files of bench/loss_parity.py")
    p.add_argument("--a", default="fused-loss=true", help="comma list: the own keys of the runs pooled as A")
    p.add_argument("--versus", default=None, help="comma list: the own keys of a configuration to read the others against")
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    args = p.parse_args(argv)
    try:
        result = pool(load_runs(args.files), tuple(k for k in args.a.split(",") if k))
        if not result["seeds"]:
            raise BadInput(f"no run's own keys are exactly --a {args.a}: nothing to pool as A")
        if args.versus:
            result["versus"] = versus(result["configs"], tuple(k for k in args.versus.split(",") if k))
    except BadInput as err:
        print(f"parity_pool.py: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
