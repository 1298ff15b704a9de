#!/usr/bin/env python
"""bf16-weights against float32 weights in one process, step by step: where could their losses part?

Three trainers of one config and seed: A (float32 weights), B (`bf16-weights=true`) and A2 (A again, whose
difference to A is what a rerun moves). Per parameter group (a block's layer summed over the blocks), the
relative difference ||X - A|| / ||A|| of:
  1. the first step's gradients on one batch: B's and A2's, beside A's own second pass (the GPU's atomics);
  2. the update of one optimizer step that all three take on A's gradients;
  3. after --steps steps of training each: the weights (beside their norms), with each run's loss and final
     validation loss;
  4. with B and A2 given A's final weights, masters, moments and step counts: the validation loss on the same
     weights, one more step's gradients and the update on A's gradients.
A difference beyond rounding at 1, 2 or 4 locates an arithmetic cause; at 3 A2's is the scale.

    PYTHONPATH=src GPTFORGE_BENCH_OUT=out python3 bench/bf16_weights_trace.py --steps 500 --seed 1337
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from loss_parity import signed_drift  # bench/ is this script's directory


def run_keys(args, root: Path) -> dict[str, list[str]]:
    cache = [] if any(k.startswith("data-cache-dir=") for k in args.set) else [f"data-cache-dir={root / 'data'}"]
    common = [*cache, f"micro-batch-size={args.batch}", f"global-batch-size={args.batch}", f"train-iters={args.steps}",
              f"lr-warmup-iters={max(1, args.steps // 10)}", f"eval-interval={args.steps}",
              f"save-interval={args.steps}", "eval-iters=4", f"seed={args.seed}", "log-interval=100",
              "keep-last=1", *args.set]
    return {"A": common + ["bf16-weights=false"], "B": common + ["bf16-weights=true"],
            "A2": common + ["bf16-weights=false"]}


def make_trainer(config: str, keys: list[str], run_dir: Path):
    from rich.console import Console

    from gptforge.train.config import load_config
    from gptforge.train.loop import RunOptions, Trainer

    trainer = Trainer(load_config(config, keys)[0], RunOptions(run_dir=run_dir, config_name=config),
                      console=Console(quiet=True))
    trainer.preflight()
    trainer.setup()
    return trainer


def group(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blocks" else name


def weights(trainer) -> dict:
    """Each parameter's float32 value: the master where the optimizer keeps one (a copy, never a view)."""
    from gptforge.train.master import MasterAdamW

    opt = trainer.engine.optimizer
    masters = isinstance(opt, MasterAdamW)
    return {n: (opt.state[p]["master"] if masters and opt.is_low(p) else p.detach()).float().clone()
            for n, p in trainer.model.named_parameters()}


def relative(ref: dict, other: dict) -> dict[str, float]:
    num, den = defaultdict(float), defaultdict(float)
    for n, value in ref.items():
        num[group(n)] += (other[n] - value).double().pow(2).sum().item()
        den[group(n)] += value.double().pow(2).sum().item()
    return {g: (num[g] / den[g]) ** 0.5 if den[g] else 0.0 for g in num}


def norms(values: dict) -> dict[str, float]:
    total = defaultdict(float)
    for n, value in values.items():
        total[group(n)] += value.double().pow(2).sum().item()
    return {g: s ** 0.5 for g, s in total.items()}


def gradients(trainer, x, y) -> dict:
    """The gradients of one micro step on (x, y), copied (under CUDA graphs they are the graph's memory)."""
    trainer.engine.micro_step(x, y, is_last=True)
    grads = {n: p.grad.detach().float().clone() for n, p in trainer.model.named_parameters()}
    trainer.engine.optimizer.zero_grad(set_to_none=True)
    return grads


def step_on(trainers: dict, grads: dict) -> dict:
    """Every trainer takes one optimizer step on GRADS; the update each made."""
    updates = {}
    for name, trainer in trainers.items():
        before = weights(trainer)
        for n, p in trainer.model.named_parameters():
            p.grad = grads[n].to(p.dtype).clone()
        trainer.engine.step()
        updates[name] = {n: v - before[n] for n, v in weights(trainer).items()}
    return updates


def compare_step(trainers: dict, x, y) -> dict:
    """Gradients on (x, y) (A twice, then B and A2), then one step of all three on A's."""
    a = gradients(trainers["A"], x, y)
    grads = {"A again": gradients(trainers["A"], x, y), "B": gradients(trainers["B"], x, y),
             "A2": gradients(trainers["A2"], x, y)}
    updates = step_on(trainers, a)
    return {"gradients": {k: relative(a, g) for k, g in grads.items()},
            "update": {k: relative(updates["A"], updates[k]) for k in ("B", "A2")}}


def copy_state(src, dst) -> None:
    """DST's weights, masters, moments and step counts set to SRC's (a float32-weights trainer)."""
    import torch

    from gptforge.train.master import MasterAdamW

    so, do = src.engine.optimizer, dst.engine.optimizer
    with torch.no_grad():
        for ps, pd in zip(src.model.parameters(), dst.model.parameters()):
            for name in ("exp_avg", "exp_avg_sq"):
                do.state[pd][name].copy_(so.state[ps][name])
            do.state[pd]["step"].fill_(float(so.state[ps]["step"]))
            pd.copy_(ps.to(pd.dtype))
            if isinstance(do, MasterAdamW) and do.is_low(pd):
                do.state[pd]["master"].copy_(ps)


def train(trainers: dict, steps: int) -> dict[str, list[float]]:
    losses = {name: [] for name in trainers}
    t0 = time.perf_counter()
    for step in range(steps):
        for name, trainer in trainers.items():
            losses[name].append(trainer.train_step()["loss"])
        if (step + 1) % 50 == 0 or step + 1 == steps:
            tail = "  ".join(f"{n} {sum(v[-50:]) / len(v[-50:]):.4f}" for n, v in losses.items())
            print(f"  step {trainers['A'].step}: last-50 mean loss {tail}  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return losses


def print_table(title: str, columns: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'group':24s}" + "".join(f"{c:>12s}" for c in columns))
    for g in next(iter(columns.values())):
        print(f"  {g:24s}" + "".join(f"{col[g]:12.2e}" for col in columns.values()))


def trace(args, root: Path) -> dict:
    import torch

    keys = run_keys(args, root)
    trainers = {name: make_trainer(args.config, run, root / name) for name, run in keys.items()}
    print("  B: " + next(n for n in trainers["B"].notes if n.startswith("optimizer")))
    start = weights(trainers["A"])
    same_start = all(torch.equal(start[n], v) for t in ("B", "A2") for n, v in weights(trainers[t]).items())
    x, y = trainers["A"].reader.get(0)
    for _ in range(3):  # compilation and CUDA graph recording, off the record
        for trainer in trainers.values():
            gradients(trainer, x, y)
    first = compare_step(trainers, x, y)
    print_table("1. first step's gradients, relative to A's", first["gradients"])
    print_table("2. one step on A's gradients: the update, relative to A's", first["update"])
    losses = train(trainers, args.steps - 1)
    final = {name: weights(t) for name, t in trainers.items()}
    val = {name: t.evaluate() for name, t in trainers.items()}
    print_table(f"3. after {args.steps} steps: the weights' norms", {n: norms(w) for n, w in final.items()})
    print_table("   their distance, relative to A's", {k: relative(final["A"], final[k]) for k in ("B", "A2")})
    drift = {k: signed_drift(losses["A"], losses[k]) for k in ("B", "A2")}
    print(f"   drift (last-half mean loss minus A's): B {drift['B']:+.4f}, A2 {drift['A2']:+.4f}; validation loss "
          + ", ".join(f"{k} {v:.4f}" for k, v in val.items()))
    for name in ("B", "A2"):
        copy_state(trainers["A"], trainers[name])
    same_val = {name: t.evaluate() for name, t in trainers.items()}
    x, y = trainers["A"].reader.get(args.batch * args.steps * 2)
    late = compare_step(trainers, x, y)
    print("\n4. B and A2 on A's final state: validation loss " + ", ".join(f"{k} {v:.5f}" for k, v in same_val.items()))
    print_table("   one more step's gradients, relative to A's", late["gradients"])
    print_table("   the update on A's gradients, relative to A's", late["update"])
    for trainer in trainers.values():
        trainer.metrics.close()
    return {"config": args.config, "seed": args.seed, "steps": args.steps, "batch": args.batch, "keys": keys,
            "same_start": same_start, "first": first, "losses": losses, "drift": drift, "final_val_loss": val,
            "final_norms": {n: norms(w) for n, w in final.items()},
            "final_distance": {k: relative(final["A"], final[k]) for k in ("B", "A2")},
            "val_on_a_state": same_val, "late": late}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="gpt2-124m", help="packaged config name or .toml path")
    p.add_argument("--steps", type=int, default=500, help="training steps of each run (>= 2)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--batch", type=int, default=16, help="sequences per step (micro = global)")
    p.add_argument("--set", type=lambda s: [k for k in s.split(",") if k], default=["hopper-kernels=auto"],
                   metavar="K=V,...", help="config keys for all three runs (default hopper-kernels=auto)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.steps < 2 or args.batch < 1:
        print("bf16_weights_trace.py: --steps must be >= 2 and --batch >= 1", file=sys.stderr)
        return 2
    from gptforge.errors import GptforgeError

    root = Path(tempfile.mkdtemp(prefix="bf16w-"))  # the three run directories and, unless --set names one, the corpus cache
    try:
        report = trace(args, root)
    except GptforgeError as e:
        print(f"bf16_weights_trace.py: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", ".")) / "bf16_weights_trace.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
