"""`pixi run -e ENV setup`, then `pixi run -e ENV train-gpt2`, step by step and timed, on this machine.

    python bench/setup_chain.py --env cuda-13-0 [--apex-src DIR] [--train ARG ...]

Runs each task of pixi.toml the way pixi does (tests/pixi_emulator.py: activation, cwd, depends-on
order) in the running interpreter's environment, and prints one row per step: seconds, exit status
and the line that matters. --apex-src is passed to build-apex (machines without network);
--train arguments to train-gpt2. Stops at the first failing step, like pixi.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from pixi_emulator import Workspace  # noqa: E402

SUMMARY = re.compile(r"^(?:\S+: skipped: .*|ok.*train: .*|smoke: .*|.*validation loss.*|verified .*|.*built .*|ok: .*)$", re.M)


def headline(text: str) -> str:
    found = SUMMARY.findall(text)
    return found[-1] if found else (text.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="cuda-13-0")
    parser.add_argument("--apex-src", help="apex source tree for build-apex (--src)")
    parser.add_argument("--train", nargs="*", default=[], help="arguments for train-gpt2")
    parser.add_argument("--only", choices=("setup", "train-gpt2"), help="run only the setup chain, or only train-gpt2")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    ws = Workspace(ROOT)
    steps = [t for t in ws.order(args.env, "setup") if t.cmd] + [ws.tasks(args.env)["train-gpt2"]]
    if args.only:
        steps = steps[-1:] if args.only == "train-gpt2" else steps[:-1]
    extra = {"build-apex": ["--src", args.apex_src] if args.apex_src else [], "train-gpt2": args.train}
    rows = []
    for task in steps:
        start = time.perf_counter()
        result = ws.run_one(args.env, task, extra.get(task.name, []), timeout=3600)
        seconds = time.perf_counter() - start
        text = result.stdout + result.stderr
        print(f"===== {task.name} ({seconds:.1f} s, exit {result.returncode})\n{text[-6000:]}", flush=True)
        rows.append({"step": task.name, "seconds": round(seconds, 1), "exit": result.returncode, "result": headline(text)})
        if result.returncode != 0:
            break
    print(f"\n{'step':<15} {'seconds':>8} {'exit':>4}  result")
    for row in rows:
        print(f"{row['step']:<15} {row['seconds']:>8} {row['exit']:>4}  {row['result']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if rows and all(r["exit"] == 0 for r in rows) and len(rows) == len(steps) else 1


if __name__ == "__main__":
    sys.exit(main())
