"""On a GPU: the tiny config trains in bf16 with fused AdamW, reports MFU against a named peak, and a run
killed mid-step resumes to the same losses (GPU kernels such as the embedding backward use atomics, so
equality is to a tolerance there; the CPU tests check it bit for bit)."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from conftest import run_cli
from gptforge.train.metrics import read_records
from gptforge.train.peaks import lookup

# marks, not a skip at import: outside `pytest -m gpu` the module is deselected instead of skipped
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

RUN = ["--config", "gpt2-tiny", "--device", "cuda", "train-iters=120", "save-interval=40", "eval-interval=40"]


def history(run_dir):
    return [(r["kind"], r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_tiny_on_gpu_learns_and_resumes(tmp_path):
    run = RUN
    ref = run_cli("train", "--run-dir", str(tmp_path / "ref"), *run, "--json", cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    summary = json.loads(ref.stdout)
    assert summary["final_val_loss"] < 6.3 < summary["first_val_loss"]
    notes = {note["code"]: note["message"] for note in summary["notes"]}
    assert "bf16 autocast" in notes["precision"] and "fused CUDA kernel" in notes["optimizer"]
    peak = lookup(torch.cuda.get_device_name())
    last = read_records(tmp_path / "ref" / "metrics.jsonl", "train")[-1]
    if peak.bf16_flops is None:
        assert "mfu-not-reported" in notes and last["mfu"] is None
    else:
        assert peak.device_name in notes["mfu-peak"] and 0 < last["mfu"] < 1
    # each step timed on the device's clock: the steps beside an evaluation or a save are no outliers
    # (host clocks once charged the step before a pause for the one after it: 1 ms, 7440% MFU)
    step_ms = {r["step"]: r["step_ms"] for r in read_records(tmp_path / "ref" / "metrics.jsonl", "train")}
    middle = sorted(step_ms.values())[len(step_ms) // 2]
    beside = {n: step_ms[n] for n in (39, 40, 41, 79, 80, 81, 119, 120)}  # saves and evaluations at 40, 80, 120
    assert all(middle / 5 < t < middle * 5 for t in beside.values()), (middle, beside)

    killed = run_cli("train", "--run-dir", str(tmp_path / "run"), *run, env={"GPTFORGE_TEST_KILL_AT": "step:57"}, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    resumed = run_cli("train", "--run-dir", str(tmp_path / "run"), *run, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = history(tmp_path / "ref"), history(tmp_path / "run")
    assert [x[:2] for x in a] == [x[:2] for x in b]
    for (_, _, la), (_, _, lb) in zip(a, b):
        assert lb == pytest.approx(la, rel=2e-2)
