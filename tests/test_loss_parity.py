"""bench/loss_parity.py: two same-seed runs on the embedded corpus, fused loss against the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "loss_parity.py"
sys.path.insert(0, str(SCRIPT.parent))
import loss_parity  # noqa: E402


def test_fused_loss_trains_the_reference_curve_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "gpt2-tiny", "--steps", "8", "--batch", "4",
                           "--device", "cpu", "--max-diff", "1e-4"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "GPTFORGE_BENCH_OUT": str(tmp_path)}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    a, b = report["runs"]["a"], report["runs"]["b"]
    assert len(a["losses"]) == len(b["losses"]) == 8
    assert any("fused output layer" in n for n in b["notes"]) and not any("fused output layer" in n for n in a["notes"])
    assert a["losses"][-1] < a["losses"][0]  # it trained
    assert report["a_vs_b"]["max_abs"] < 1e-4  # fp32 on CPU: only summation order differs
    assert "a vs b: max |diff|" in proc.stdout
    assert not (tmp_path / ".gptforge").exists()  # the corpus cache went to the run's temporary directory


def test_a_run_whose_keys_could_not_apply_fails_the_comparison(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "gpt2-tiny", "--steps", "2", "--batch", "2",
                           "--device", "cpu", "--a", "fused-loss=true", "--b", "fused-loss=true,fp8-output=true"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "GPTFORGE_BENCH_OUT": str(tmp_path)}, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "run b is not what was asked: FP8 output layer asked for but needs an sm_89+ GPU" in proc.stderr
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    assert list(report["fallbacks"]) == ["b"]


def test_curve_diff_reports_max_mean_and_tail():
    d = loss_parity.curve_diff([1.0] * 10, [1.0] * 9 + [1.5])
    assert d == {"max_abs": 0.5, "mean_abs": pytest.approx(0.05), "tail_mean_abs": 0.5}


def test_bad_key_exits_2_before_training(capsys):
    assert loss_parity.main(["--b", "fused-loss=maybe", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "fused-loss must be bool" in err and len(err.strip().splitlines()) == 1
