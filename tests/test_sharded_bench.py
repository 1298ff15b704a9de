"""bench/sharded.py: every variant names choices that exist (the engines' module-level ones, a DeepSpeed config that
merges), a failed run is reported by its first error, and a whole dry run on the CPU (gloo, two processes)."""

from __future__ import annotations

import importlib
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "sharded.py"
sys.path.insert(0, str(SCRIPT.parent))
import sharded  # noqa: E402

TINY = ["num-layers=2", "hidden-size=32", "num-attention-heads=2", "seq-length=32", "max-position-embeddings=32",
        "lr-warmup-iters=1", "compile=false"]


def leaves(tree: dict, prefix: tuple = ()) -> list[tuple]:
    return [leaf for key, value in tree.items()
            for leaf in (leaves(value, prefix + (key,)) if isinstance(value, dict) else [(prefix + (key,), value)])]


@pytest.mark.parametrize("name", list(sharded.VARIANTS))
def test_every_variant_names_choices_that_exist(tmp_path, name):
    variant = sharded.VARIANTS[name]
    for dotted, value in variant.get("patches", {}).items():
        module, attr = dotted.rsplit(".", 1)
        assert type(getattr(importlib.import_module(module), attr)) is type(value), dotted
    if "deepspeed" in variant:
        config = json.loads(sharded.deepspeed_config(name, tmp_path).read_text())
        for path, value in leaves(variant.get("ds", {})):  # each change lands, the packaged rest stays
            node = config
            for key in path:
                node = node[key]
            assert node == value, path
        assert config["zero_optimization"]["stage"] == int(variant["deepspeed"][-1])


def test_a_failed_run_is_reported_by_its_first_error():
    log = "gptforge: notes\nTraceback (most recent call last):\n  File \"x.py\", line 1\n    f()\nValueError: bad\n" \
          "[rank1]: Traceback ...\ntorch.distributed.elastic.ChildFailedError:\n"
    assert sharded.first_error(log) == "ValueError: bad"
    assert sharded.first_error("no traceback\nkilled") == "no traceback\nkilled"


@pytest.mark.slow
def test_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--models", "tiny", "--micro", "4", "--per-gpu-batch", "8",
         "--warmup", "2", "--steps", "3", "--profile-steps", "2", "--engines", "ddp", "fsdp", "--profile", "fsdp",
         "--out", str(out), "--data-cache-dir", str(tmp_path / "data"), "--set", *TINY],
        capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "sharded.json").read_text())
    assert [(r["engine"], r["rc"], r["steps_timed"]) for r in rows] == [("ddp", 0, 3), ("fsdp", 0, 3)]
    assert rows[0]["last_loss"] == pytest.approx(rows[1]["last_loss"], rel=1e-4)  # one schedule, the same training
    assert "| tiny | fsdp | 2 | 16 |" in (out / "sharded.md").read_text()
    profile = (out / "tiny-fsdp.profile.txt").read_text()
    assert "sorted by self_cpu_time_total" in profile and "FSDP::" in profile
    assert not (out / "tiny-ddp.profile.txt").exists()
    with gzip.open(out / "tiny-fsdp.profile.trace.json.gz") as trace:  # the timeline, for where the host held the device up
        assert "traceEvents" in json.load(trace)
