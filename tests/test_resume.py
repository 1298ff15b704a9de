"""Exact resume: a run SIGKILLed mid-step or mid-save, then resumed, logs the uninterrupted run's losses
bit for bit (CPU, fp32); a killed save never leaves a checkpoint that --resume would pick up."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from conftest import SMALL, run_cli, run_main
from gptforge.train import checkpoint

# A small but complete setup: dropout (RNG state matters), gradient accumulation 2, eval and save every 4.
@pytest.fixture(scope="session")
def cache(train_data_cache):
    return train_data_cache


def train(run_dir, cache, *extra, kill_at=None, cwd=None):
    """The run as its own process where it is killed or stopped by a signal, else in this process: a resumed run
    knows only what the killed process left on disk, and its losses are compared with the reference's bit for bit
    (both on one thread)."""
    env = {"OMP_NUM_THREADS": "1", **({"GPTFORGE_TEST_KILL_AT": kill_at} if kill_at else {})}
    return (run_cli if kill_at else run_main)("train", "--config", "gpt2-tiny", "--run-dir", str(run_dir), *SMALL,
                                                 f"data-cache-dir={cache}", *extra, env=env, cwd=cwd)


def history(run_dir) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["kind"], r["step"], r["loss"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = train(run_dir, cache, cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_checkpoint_holds_everything_a_resume_needs(reference):
    ckpt = reference / "checkpoints" / "step_00000012"
    state = torch.load(ckpt / "trainer.pt", weights_only=True)
    assert state["step"] == 12 and state["consumed_samples"] == 12 * 8  # data position
    assert state["scheduler"]["last_epoch"] == 12 and state["scheduler"]["_last_lr"]
    assert "scaler" in state  # None in fp32; the fp16 round trip is test_fp16_loss_scale_survives_a_checkpoint
    assert state["model_shape"]["hidden_size"] == 32 and state["tokenizer"]["kind"]
    model = torch.load(ckpt / "model.pt", weights_only=True)
    optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert "wte.weight" in model
    assert len(optimizer["state"]) == len(model) - 1  # every parameter's Adam moments (lm_head is tied to wte)
    assert all(int(s["step"]) == 12 for s in optimizer["state"].values())
    rng_state = torch.load(ckpt / "rng_rank0.pt", weights_only=True)
    assert {"python", "numpy", "torch_cpu"} <= set(rng_state)


def test_fp16_loss_scale_survives_a_checkpoint(tmp_path):
    from gptforge.model.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.train.config import TrainConfig
    from gptforge.train.engine import TorchEngine
    from gptforge.train.optim import build_optimizer
    from gptforge.train.precision import Precision

    cfg = TrainConfig(train_iters=10)

    def engine():
        model = GPT(ModelConfig(num_layers=1, hidden_size=16, num_attention_heads=2, max_position_embeddings=8,
                                vocab_size=64))
        optimizer, _ = build_optimizer(model, cfg, torch.device("cpu"))
        return TorchEngine(model, model, optimizer, cfg, Precision("fp16", "cpu", ""), accum=1, ddp=False)

    first = engine()
    first.scaler.scale(torch.ones(()))  # the scale exists once a loss was scaled
    first.scaler.update(1234.0)
    model_state, optim_state, extra = first.state()
    checkpoint.write_main_files(tmp_path, 1, model_state, optim_state, {"step": 1, "model_shape": {}, **extra})
    checkpoint.write_checksums(tmp_path)
    second = engine()
    assert second.scaler.get_scale() != 1234.0
    # the file holds only what the engine writes (read_trainer_state would ask for the trainer's keys too)
    second.load(tmp_path, checkpoint.load_file(tmp_path / checkpoint.TRAINER_FILE))
    assert second.scaler.get_scale() == 1234.0


# killed mid-save: test_killed_save_is_never_picked_up covers it in the default run
@pytest.mark.parametrize("kill_at,resumes_from", [("step:7", 4), pytest.param("save:8", 4, marks=pytest.mark.slow)])
def test_killed_run_resumes_bitwise(tmp_path, cache, reference, kill_at, resumes_from):
    expected = history(reference)
    assert [h[:2] for h in expected if h[0] == "train"] == [("train", step) for step in range(1, 13)]
    run_dir = tmp_path / "run"
    killed = train(run_dir, cache, kill_at=kill_at, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert checkpoint.latest(run_dir / "checkpoints").name == checkpoint.step_dir_name(resumes_from)
    assert (run_dir / "loss.png").stat().st_size > 0  # plotted at the step-4 evaluation, before the kill
    resumed = train(run_dir, cache, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and f"(step {resumes_from})" in resumed.stdout
    evals = [h[2] for h in expected if h[0] == "eval"]
    assert f"validation loss {evals[0]:.4f} -> {evals[-1]:.4f}" in resumed.stdout  # not "nan -> ..."
    got = history(run_dir)
    assert [h[:2] for h in got] == [h[:2] for h in expected]
    assert got == expected  # float equality of every train and eval loss


def test_sigterm_mid_step_saves_and_the_requeued_run_resumes_bitwise(tmp_path, cache, reference):
    """Slurm's SIGTERM before a time limit or a preemption: the step in flight finishes, a checkpoint of it is
    written, the run exits with PREEMPTED_EXIT, and --resume logs the uninterrupted run's losses bit for bit."""
    from gptforge.train.preempt import PREEMPTED_EXIT

    run_dir = tmp_path / "run"
    stopped = train(run_dir, cache, kill_at="TERM@step:5", cwd=tmp_path)  # SIGTERM to itself mid-step 5
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert "CPU threads: 1 (OMP_NUM_THREADS)" in stopped.stdout
    newest = checkpoint.latest(run_dir / "checkpoints")
    stopped_at = int(newest.name.removeprefix("step_"))
    assert 5 <= stopped_at < 8, newest  # the steps in flight, not the step-4 checkpoint nor the run's end
    assert f"SIGTERM: stopped after step {stopped_at}" in stopped.stdout and "--resume" in stopped.stdout
    expected = history(reference)
    assert history(run_dir) == [h for h in expected if h[1] <= stopped_at]
    resumed = train(run_dir, cache, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {stopped_at})" in resumed.stdout
    assert history(run_dir) == expected  # float equality of every train and eval loss


def test_killed_save_is_never_picked_up(tmp_path, cache):
    run_dir = tmp_path / "run"
    killed = train(run_dir, cache, kill_at="save:8", cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    root = run_dir / "checkpoints"
    staged = root / ".tmp-step_00000008"
    assert (staged / "model.pt").is_file() and not (staged / "trainer.pt").exists()  # died mid-save
    assert not (root / "step_00000008").exists()
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["step_00000004"]
    assert (root / "latest").read_text().strip() == "step_00000004"
    # stop right after step 8
    resumed = train(run_dir, cache, "--resume", "train-iters=8", "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not staged.exists()  # the leftover was cleaned, the step saved again in full
    changed = [n["message"] for n in json.loads(resumed.stdout)["notes"] if n["code"] == "resume-config-changed"]
    assert len(changed) == 1 and "train-iters 12 -> 8;" in changed[0]
    assert [p.name for p in checkpoint.complete_checkpoints(root)] == ["step_00000004", "step_00000008"]


def test_keep_last_prunes_old_checkpoints(tmp_path, cache):
    run_dir = tmp_path / "run"
    proc = train(run_dir, cache, "keep-last=1", "train-iters=8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["latest", "step_00000008"]


def test_a_resume_names_every_key_that_differs_from_the_runs_saved_config(tmp_path):
    from gptforge.train.rundir import config_changes

    saved = {"bf16-residual": False, "lr": 6e-4, "data-path": ["a"]}
    assert config_changes(tmp_path, saved) is None  # nothing saved
    (tmp_path / "config.json").write_text("{not json")
    assert config_changes(tmp_path, saved) is None
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert config_changes(tmp_path, dict(saved)) is None
    note = config_changes(tmp_path, {**saved, "bf16-residual": True, "lr": 3e-4, "new-key": 1})
    assert (note.code, note.severity) == ("resume-config-changed", "warning")
    assert ": bf16-residual false -> true, lr 0.0006 -> 0.0003;" in note.message  # each changed key, no new key
