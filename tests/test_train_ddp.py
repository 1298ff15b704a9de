"""torchrun DDP on CPU (gloo): two processes reproduce one process with gradient accumulation 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import run_main

SMALL = ["--config", "gpt2-tiny", "num-layers=1", "hidden-size=32", "num-attention-heads=2", "seq-length=32",
         "max-position-embeddings=32", "micro-batch-size=4", "global-batch-size=8", "train-iters=6",
         "save-interval=3", "eval-interval=3", "eval-iters=1", "lr-warmup-iters=1", "dropout=0.0"]


def losses(run_dir) -> list[tuple]:
    return [(r["kind"], r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_two_process_ddp_matches_accumulation(train_data_cache, tmp_path):
    cache = train_data_cache
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = run_main("train", "--run-dir", str(tmp_path / "single"), *SMALL, f"data-cache-dir={cache}",
                      cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})  # the reference, in this process
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "gptforge",
         "train", "--run-dir", str(tmp_path / "ddp"), *SMALL, f"data-cache-dir={cache}", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )
    assert ddp.returncode == 0, ddp.stdout[-2000:] + ddp.stderr[-3000:]
    notes = {note["code"]: note["message"] for note in json.loads(ddp.stdout)["notes"]}
    assert "2 processes (gloo)" in notes["ddp"]
    assert "accumulation 1 x data-parallel 2" in ddp.stderr
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert [x[:2] for x in a] == [x[:2] for x in b]
    for (_, _, la), (_, _, lb) in zip(a, b):
        assert lb == pytest.approx(la, rel=1e-4)
    assert (tmp_path / "ddp" / "checkpoints" / "step_00000006" / "rng_rank1.pt").is_file()
