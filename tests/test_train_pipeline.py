"""The trainer queues step N+1 before reading step N's loss: the same numbers, and a bad loss still stops
the run before anything is evaluated or saved after it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from gptforge.train.config import load_config
from gptforge.train.data import DataSetup, TokenizerSpec
from gptforge.train.loop import NonFiniteLoss, RunOptions, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from train_gpt2_bench import RandomTokens  # noqa: E402

VOCAB = 300
KEYS = ["micro-batch-size=2", "global-batch-size=4", "train-iters=6", "eval-interval=3", "eval-iters=1",
        "save-interval=4", "log-interval=100", "num-layers=1", "seq-length=16", "lr-warmup-iters=1"]


def trainer(tmp_path: Path, name: str, device: str = "cpu") -> Trainer:
    cfg, _ = load_config("gpt2-tiny", KEYS)
    data = DataSetup(RandomTokens(64, cfg.seq_length, VOCAB, 0), RandomTokens(8, cfg.seq_length, VOCAB, 1),
                     TokenizerSpec("gpt2"), VOCAB, "random tokens")
    t = Trainer(cfg, RunOptions(run_dir=tmp_path / name, config_name="gpt2-tiny", device=device), data=data,
                console=Console(quiet=True))
    t.preflight()
    t.setup()
    return t


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_queued_steps_give_the_losses_and_norms_of_one_step_at_a_time(tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    one_by_one = trainer(tmp_path, "a", device)
    expected = [one_by_one.train_step() for _ in range(6)]
    queued = list(trainer(tmp_path, "b", device).steps(6))
    assert [r["step"] for r in queued] == [1, 2, 3, 4, 5, 6]
    got = [(r["loss"], r["grad_norm"], r["lr"]) for r in queued]
    want = [(r["loss"], r["grad_norm"], r["lr"]) for r in expected]
    if device == "cpu":
        assert got == want  # bit for bit
    else:  # GPU kernels with atomics differ in the last bits from run to run
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    assert all(r["step_ms"] > 0 for r in queued)


def test_steps_followed_by_an_evaluation_or_a_save_are_read_before_the_next_is_queued(tmp_path):
    t = trainer(tmp_path, "c")
    seen = []
    for record in t.steps(6):
        seen.append((record["step"], t.step))
    # step 1 is read once step 2 is queued; steps 3 (eval), 4 (save) and 6 (last) with nothing after them
    assert seen == [(1, 2), (2, 3), (3, 3), (4, 4), (5, 6), (6, 6)]


def test_a_launched_step_knows_whether_it_was_queued_behind_another(tmp_path):
    t = trainer(tmp_path, "e")
    first = t.launch_step()
    second = t.launch_step()
    assert (first.overlapped, second.overlapped) == (False, True)
    assert first.start is None and first.ready is None  # no device clock on a CPU: the host's times the step
    t.finish_step(first), t.finish_step(second)
    assert t.launch_step().overlapped is False


def test_a_non_finite_loss_stops_the_run_at_its_step_before_the_checkpoint_after_it(tmp_path):
    t = trainer(tmp_path, "d")
    real = t.engine.micro_step

    def poisoned(x, y, is_last):
        loss = real(x, y, is_last)
        return loss * float("nan") if t.step == 3 else loss  # step 4 is being computed: t.step counts done ones

    t.engine.micro_step = poisoned
    with pytest.raises(NonFiniteLoss, match="training loss is nan at step 4"):
        t.loop()
    assert not list((t.ckpt_root).glob("step_*"))  # step 4 is a save step: nothing was written


class DeviceClock:
    """An event on a made-up device timeline: elapsed_time in milliseconds, as torch.cuda.Event's."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def elapsed_time(self, end: "DeviceClock") -> float:
        return (end.seconds - self.seconds) * 1e3


def test_a_step_is_timed_from_the_end_of_the_one_before_it_when_queued_behind_it_else_from_its_own_start():
    from gptforge.train.steptime import LaunchedStep, StepClock

    clock = StepClock()
    values = torch.zeros(2)

    def finish(start: float, end: float, overlapped: bool) -> float:
        launched = LaunchedStep(1, values, DeviceClock(end), 0.0, 0.0, DeviceClock(start), overlapped)
        return clock.seconds(launched)

    assert finish(0.0, 30.0, overlapped=False) == pytest.approx(30.0)  # the first step: compilation included
    assert finish(29.0, 30.1, overlapped=True) == pytest.approx(0.1)   # queued while the first one ran
    assert finish(29.5, 30.2, overlapped=True) == pytest.approx(0.1)
    # then the loop evaluates: the next step starts on an idle device
    assert finish(45.0, 45.1, overlapped=False) == pytest.approx(0.1)
    assert finish(45.05, 45.2, overlapped=True) == pytest.approx(0.1)


def test_on_a_cpu_each_step_is_timed_by_its_own_work(tmp_path):
    """A CPU computes a step while the loop queues it: the step before an evaluation and the last one, read with
    nothing queued behind them, were charged the moment between two reads (a millisecond, millions of tok/s)."""
    t = trainer(tmp_path, "f")
    pause = 0.05  # each micro batch takes at least this long, so every step takes at least pause * accum
    records = list(t.steps(6, on_micro=lambda: time.sleep(pause)))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    floor_ms = pause * t.accum * 1e3
    assert all(r["step_ms"] >= floor_ms for r in records), [(r["step"], round(r["step_ms"], 2)) for r in records]
