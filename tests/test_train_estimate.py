"""Before training: the step-time estimate names hopeless configs and the one that fits; the progress
bar has an ETA after the first micro-step."""

from __future__ import annotations

import io
import math

import torch
from rich.console import Console

from gptforge.model.gpt import GPT
from gptforge.train.config import load_config
from gptforge.train.estimate import HOPELESS_SECONDS, estimate, flops_per_token, run_flops
from gptforge.train.progress import RunProgress

CPU = torch.device("cpu")


def test_124m_on_a_cpu_is_hopeless_and_names_the_config_that_fits():
    cfg, _ = load_config("gpt2-124m")
    found = estimate(cfg, 8192, CPU, config_name="gpt2-124m")
    assert found.hopeless and found.run_seconds > HOPELESS_SECONDS
    assert found.fits == "gpt2-tiny"  # 124M needs ~7e18 FLOPs: 80 TFLOP/s to finish in a day
    text = found.describe()
    assert "gpt2-124m is hopeless on cpu" in text and "--config gpt2-tiny" in text


def test_tiny_fits_a_cpu():
    cfg, _ = load_config("gpt2-tiny")
    found = estimate(cfg, 2048, CPU, config_name="gpt2-tiny")
    assert not found.hopeless and "hopeless" not in found.describe()
    assert 0 < found.step_seconds < found.run_seconds


def test_run_flops_use_the_models_own_count():
    cfg, _ = load_config("gpt2-tiny", ["train-iters=10", "eval-interval=5", "eval-iters=3"])
    model = GPT(cfg.model_config(2048))
    assert flops_per_token(cfg, 2048) == model.flops_per_token(cfg.seq_length)
    step, total = run_flops(cfg, 2048, 10)
    assert step == model.flops_per_token(cfg.seq_length) * cfg.global_batch_size * cfg.seq_length
    assert total == 10 * step + 3 * 3 * step / 3  # evaluations at steps 0, 5, 10: forward only


def test_the_estimate_leaves_the_random_streams_alone():
    cfg, _ = load_config("gpt2-tiny")
    before = torch.get_rng_state()
    estimate(cfg, 2048, CPU)
    assert torch.equal(before, torch.get_rng_state())  # exact resume depends on it


def test_progress_has_an_eta_after_the_first_micro_step():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with RunProgress(console, enabled=True, total=64, done=0) as bar:
        assert math.isnan(bar.seconds_left())
        bar.advance()
        task = bar.bar.tasks[0]
        assert task.completed == 1 and task.fields["eta"].startswith("ETA ")
        assert bar.seconds_left() == bar.spent * 63
    assert "train micro-steps" in console.file.getvalue()
