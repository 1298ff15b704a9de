"""The tiny config learns the embedded corpus on CPU; a run leaves metrics, TensorBoard events, a plot. The run and
the samples run in this process (run_main)."""

from __future__ import annotations

import json
import math
from pathlib import Path


from conftest import run_main
from gptforge.train.metrics import read_records

# Measured (docs/train.md): gpt2-tiny (2048-token BPE), 200 steps on the embedded corpus, CPU fp32:
# validation loss 7.607 -> 5.902 (ln 2048 = 7.62). The corpus' unigram entropy is 6.28 nats/token, so
# the bound, 0.25 above the measurement, is only met by a model that uses context, not token counts.
VAL_LOSS_BOUND = 6.15
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # steadier than two threads on a shared two-core machine


def train_tiny(workdir: Path, train_data_cache: Path) -> tuple[Path, dict]:
    proc = run_main("train", "--config", "gpt2-tiny", "--run-dir", str(workdir / "run"), "train-iters=200",
                    f"data-cache-dir={train_data_cache}", "--json", cwd=workdir, env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir / "run", json.loads(proc.stdout)


def test_the_tiny_config_learns_leaves_its_logs_and_samples(tmp_path, train_data_cache):
    """One 200-step run (the suite's longest CPU run, so one test): it learns, leaves its logs, plot and
    checkpoint, and samples from that checkpoint."""
    run_dir, summary = train_tiny(tmp_path, train_data_cache)
    evals = read_records(run_dir / "metrics.jsonl", "eval")
    train = read_records(run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in train] == list(range(1, 201))
    assert evals[0]["step"] == 0 and abs(evals[0]["loss"] - math.log(2048)) < 0.3
    assert summary["final_val_loss"] == evals[-1]["loss"] < VAL_LOSS_BOUND
    assert evals[-1]["loss"] < evals[len(evals) // 2]["loss"] < evals[0]["loss"]
    record = read_records(run_dir / "metrics.jsonl", "train")[-1]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "mfu", "mem_gib"} <= set(record)
    assert record["tokens_per_s"] > 0 and record["mfu"] is None  # CPU: no peak, says so
    notes = {note["code"]: note["message"] for note in summary["notes"]}
    assert "mfu-not-reported" in notes and "fp32" in notes["precision"]
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "step_00000200" / "trainer.pt").is_file()
    assert (run_dir / "config.json").is_file() and (run_dir / "tokenizer").is_dir()
    assert summary["plot"] == str(run_dir / "loss.png")
    assert 0 < summary["train_passes"] < 1  # 200 steps of 16 samples read a quarter of the corpus' training split
    assert "data-repeats" not in notes
    proc = run_main("sample", "--checkpoint", str(run_dir), "--prompt", "The list", "--max-new-tokens", "30", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["step"] == 200 and out["tokens"] == 30 and out["completion"]
    again = run_main("sample", "--checkpoint", str(run_dir), "--prompt", "The list", "--max-new-tokens", "30", "--json")
    assert json.loads(again.stdout)["completion"] == out["completion"]  # seeded


def test_a_run_that_repeats_its_data_says_its_training_loss_is_not_held_out():
    from types import SimpleNamespace

    from gptforge.train.data import repeat_note

    assert repeat_note(SimpleNamespace(passes=1.0)) is None and repeat_note(object()) is None
    note = repeat_note(SimpleNamespace(passes=10.24))
    assert note.code == "data-repeats" and " 10.2 " in note.message


def test_sample_without_a_checkpoint_is_one_line(tmp_path):
    proc = run_main("sample", "--checkpoint", str(tmp_path), "--prompt", "x")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "no complete checkpoint" in proc.stderr


def test_every_note_code_is_documented():
    """Note codes are an API: each code the trainer and the speed package write has a row in docs/train.md."""
    from conftest import documented_codes, emitted_codes

    repo = Path(__file__).resolve().parents[1]
    emitted = emitted_codes(repo / "src/gptforge/train") | emitted_codes(repo / "src/gptforge/accel")
    assert {"precision", "resume-config-changed", "loss-triton-kernel"} <= emitted
    assert emitted == documented_codes(repo / "docs/train.md", "Startup notes (stable codes)")
