#!/usr/bin/env python
"""The GPU's clocks and power while it was busy, per phase of a benchmark, from an nvidia-smi log.

Log while a benchmark runs (one sample every 100 ms), marking each phase's start in a second file:

    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu \\
        --format=csv,noheader,nounits -lms 100 > clocks.csv &
    echo "nanogpt $(date '+%Y/%m/%d %H:%M:%S.%3N')" >> marks.txt   # before each phase; "end" after the last

Per phase (from one mark to the next; without --marks, per stretch of busy samples at least 1 s long), over
the samples with utilization >= 90%: the SM clock's median and 10th percentile, the power draw's median,
and how many samples name the software power cap (event reason 0x4) as active. A GPU at its power limit
runs the denser code at the lower clock, so two codes' speeds compare at their own clocks, not the peak's.

    python3 bench/gpu_clocks.py bench/results/sustained/run68-clocks.csv --marks bench/results/sustained/run68-marks.txt
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

COLUMNS = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu"
BUSY = 90  # utilization, percent
POWER_CAP = 0x4  # clocks_event_reasons: SW power cap
MIN_STRETCH_S = 1.0


class BadInput(Exception):
    pass


def when(text: str) -> float:
    return datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()


def read_samples(path: Path, columns: str) -> list[dict]:
    """Each complete row as {t, sm, power, capped, util}."""
    names = columns.split(",")
    need = ("timestamp", "clocks.sm", "power.draw", "clocks_event_reasons.active", "utilization.gpu")
    if missing := [n for n in need if n not in names]:
        raise BadInput(f"--columns lacks {', '.join(missing)}")
    at = {n: names.index(n) for n in need}
    samples = []
    try:
        for row in csv.reader(path.open()):
            if len(row) != len(names) or not row[at["utilization.gpu"]].strip().isdigit():
                continue  # a line cut off when the logger was stopped, or "[N/A]"
            samples.append({"t": when(row[at["timestamp"]]), "sm": float(row[at["clocks.sm"]]),
                            "power": float(row[at["power.draw"]]),
                            "capped": bool(int(row[at["clocks_event_reasons.active"]], 16) & POWER_CAP),
                            "util": int(row[at["utilization.gpu"]])})
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not an nvidia-smi log of {columns} ({e})") from None
    return samples


def read_marks(path: Path) -> list[tuple[str, float]]:
    try:
        return [(name, when(stamp)) for name, stamp in (line.split(" ", 1) for line in path.read_text().splitlines() if line)]
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not lines of 'NAME YYYY/MM/DD HH:MM:SS.mmm' ({e})") from None


def stretches(samples: list[dict]) -> list[tuple[str, float, float]]:
    """(name, start, end) of each run of busy samples at least MIN_STRETCH_S long (gaps under 0.5 s bridged)."""
    found, start, last = [], None, None
    for s in samples:
        if s["util"] < BUSY:
            continue
        if start is not None and s["t"] - last > 0.5:
            found.append((start, last))
            start = None
        start, last = (s["t"] if start is None else start), s["t"]
    if start is not None:
        found.append((start, last))
    return [(f"busy {i + 1}", a, b + 1e-3) for i, (a, b) in enumerate(p for p in found if p[1] - p[0] >= MIN_STRETCH_S)]


def phase(samples: list[dict], name: str, start: float, end: float) -> dict:
    busy = [s for s in samples if start <= s["t"] < end and s["util"] >= BUSY]
    row = {"phase": name, "seconds": end - start, "busy_samples": len(busy)}
    if busy:
        sm = sorted(s["sm"] for s in busy)
        row.update(sm_mhz_median=statistics.median(sm), sm_mhz_p10=sm[len(sm) // 10],
                   power_w_median=statistics.median(s["power"] for s in busy), power_capped=sum(s["capped"] for s in busy))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu_clocks.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path, help="nvidia-smi's CSV (noheader, nounits)")
    p.add_argument("--marks", type=Path, default=None, help="lines 'NAME TIMESTAMP', one per phase start, the last one its end")
    p.add_argument("--columns", default=COLUMNS, help=f"the log's --query-gpu list (default {COLUMNS})")
    p.add_argument("--json", action="store_true", help="the phases as JSON on stdout")
    args = p.parse_args(argv)
    try:
        samples = read_samples(args.log, args.columns)
        if args.marks:
            marks = read_marks(args.marks)
            phases = [(name, a, b) for (name, a), (_, b) in zip(marks, marks[1:])]
        else:
            phases = stretches(samples)
    except BadInput as e:
        print(f"gpu_clocks.py: {e}", file=sys.stderr)
        return 2
    rows = [phase(samples, *ph) for ph in phases]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if not r["busy_samples"]:
            print(f"{r['phase']}: {r['seconds']:.1f} s, never busy")
            continue
        print(f"{r['phase']}: {r['seconds']:.1f} s, {r['busy_samples']} busy samples: SM clock median {r['sm_mhz_median']:.0f} MHz "
              f"(10th percentile {r['sm_mhz_p10']:.0f}), power median {r['power_w_median']:.0f} W, "
              f"at the power cap in {r['power_capped']} of {r['busy_samples']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
