"""bench/gpu_clocks.py: the GPU's clocks and power per benchmark phase, from the committed nvidia-smi logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_clocks.py"
SUSTAINED = ROOT / "bench" / "results" / "sustained"


def clocks(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_each_marked_phase_gives_the_figures_benchmarks_quotes():
    proc = clocks(SUSTAINED / "run68-clocks.csv", "--marks", SUSTAINED / "run68-marks.txt", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["phase"]: r for r in json.loads(proc.stdout)}
    assert {name: (r["sm_mhz_median"], round(r["power_w_median"])) for name, r in rows.items()} == {
        "nanogpt-train": (1800, 692), "fast": (1590, 689), "defaults": (1740, 693)}
    assert all(r["power_capped"] >= r["busy_samples"] - 1 for r in rows.values())  # at the 700 W cap throughout


def test_without_marks_each_busy_stretch_is_a_phase():
    rows = json.loads(clocks(SUSTAINED / "run68-clocks.csv", "--json").stdout)
    longest = sorted(rows, key=lambda r: r["seconds"])[-3:]  # the three timed loops: train.py, the 1.3x set, the defaults
    assert sorted(r["sm_mhz_median"] for r in longest) == [1590, 1740, 1800]


def test_a_log_of_other_columns_or_bad_marks_exits_2_in_one_line(tmp_path):
    marks = tmp_path / "marks.txt"
    marks.write_text("start yesterday\n")
    for args, says in (([SUSTAINED / "run68-clocks.csv", "--columns", "timestamp,clocks.sm"], "--columns lacks power.draw"),
                       ([SUSTAINED / "run68-clocks.csv", "--marks", marks], "not lines of 'NAME")):
        proc = clocks(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr
