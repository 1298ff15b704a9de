"""bench/nanogpt_train.py: nanoGPT's own train.py on synthetic tokens, its per-iteration times read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "nanogpt_train.py"
NANOGPT = Path(os.environ.get("GPTFORGE_NANOGPT_DIR", ROOT / "third_party" / "nanogpt"))
sys.path.insert(0, str(SCRIPT.parent))
import nanogpt_train  # noqa: E402

TRAIN_OUTPUT = """tokens per iteration will be: 32,768
step 0: train loss 10.9823, val loss 10.9811
iter 0: loss 10.9834, time 31250.12ms, mfu -100.00%
iter 1: loss 10.9001, time 80.00ms, mfu -100.00%
iter 2: loss 10.8000, time 72.00ms, mfu -100.00%
iter 3: loss 10.7000, time 70.00ms, mfu 39.00%
iter 4: loss nan, time 71.00ms, mfu 39.10%
iter 5: loss 10.5000, time 90.00ms, mfu 38.00%
"""


def test_the_figures_are_train_pys_own_times_after_the_skipped_iterations():
    s = nanogpt_train.summary(TRAIN_OUTPUT, skip=2, tokens_per_iter=32768)
    assert (s["iters"], s["ms_median"], s["ms_p10"], s["ms_p90"]) == (4, 71.5, 70.0, 90.0)
    assert s["tokens_per_s"] == pytest.approx(32768 / 0.0715)
    assert "failed" in nanogpt_train.summary(TRAIN_OUTPUT, skip=6, tokens_per_iter=1)


def test_train_py_gets_gptforges_shape_one_micro_batch_and_no_checkpoint():
    shape = {"layers": 24, "heads": 16, "width": 1024, "seq": 1024}
    cmd = nanogpt_train.command(Path("/n"), shape, 32, 150, "cuda", "bf16", True)
    assert cmd[1] == str(Path("/n/train.py").resolve()) and cmd[3] == "--out_dir=out"  # relative: nothing lands outside the work dir
    for arg in ("--n_layer=24", "--n_head=16", "--n_embd=1024", "--block_size=1024", "--batch_size=32",
                "--gradient_accumulation_steps=1", "--bias=True", "--dtype=bfloat16", "--max_iters=150",
                "--eval_interval=151", "--always_save_checkpoint=False"):
        assert arg in cmd


def test_a_directory_without_train_py_exits_2_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nanogpt", str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "has no train.py, model.py, configurator.py" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(nanogpt_train.check_checkout(NANOGPT) is not None, reason="no nanoGPT checkout with train.py (set GPTFORGE_NANOGPT_DIR)")
def test_a_dry_run_on_the_cpu_reads_every_iteration_after_the_skip():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nanogpt", str(NANOGPT), "--device", "cpu", "--precision", "fp32",
                           "--models", "gpt2-tiny", "--iters", "3", "--skip", "1", "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = json.loads(proc.stdout)
    assert result["model"] == "gpt2-tiny" and result["iters"] == 3 and result["tokens_per_s"] > 0


def test_the_committed_sustained_runs_give_the_ratios_benchmarks_quotes():
    sustained = ROOT / "bench" / "results" / "sustained"
    (nanogpt,) = json.loads((sustained / "run68-nanogpt-train.json").read_text())
    gptforge = {name: json.loads((sustained / f"run68-{name}-200-steps.json").read_text())["comparison"][0]["gptforge"]
                for name in ("fastest", "defaults")}
    assert (round(nanogpt["tokens_per_s"]), nanogpt["ms_median"], nanogpt["iters"]) == (458166, 71.52, 151)
    assert {name: (g["steps"], round(g["tokens_per_s"] / nanogpt["tokens_per_s"], 3)) for name, g in gptforge.items()} == {
        "fastest": (200, 1.307), "defaults": (200, 1.143)}
