"""The training loop holds Python's automatic garbage collector off and collects the young generations
every gc-interval steps, right after a step is queued; gc-interval=0 leaves the collector alone."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gptforge.errors import UsageError
from gptforge.train.config import load_config, validate
from gptforge.train.data import DataSetup, TokenizerSpec
from gptforge.train.loop import RunOptions, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from train_gpt2_bench import RandomTokens  # noqa: E402

VOCAB = 300
KEYS = ["micro-batch-size=2", "global-batch-size=2", "train-iters=6", "eval-interval=1000", "save-interval=1000",
        "log-interval=100", "num-layers=1", "seq-length=16", "lr-warmup-iters=1"]


def trainer(tmp_path: Path, *keys: str) -> Trainer:
    cfg, _ = load_config("gpt2-tiny", KEYS + list(keys))
    data = DataSetup(RandomTokens(64, cfg.seq_length, VOCAB, 0), RandomTokens(8, cfg.seq_length, VOCAB, 1),
                     TokenizerSpec("gpt2"), VOCAB, "random tokens")
    t = Trainer(cfg, RunOptions(run_dir=tmp_path / "run", config_name="gpt2-tiny", device="cpu"), data=data,
                console=Console(quiet=True))
    t.preflight()
    t.setup()
    return t


def collections_during(steps_iter) -> tuple[list[tuple[int, bool]], list[tuple[int, int]]]:
    """(generation, automatic collector on) for each collection started; (step, collections so far) per record."""
    seen, records = [], []

    def on_collection(phase, info):
        if phase == "start":
            seen.append((info["generation"], gc.isenabled()))

    gc.callbacks.append(on_collection)
    try:
        for record in steps_iter:
            records.append((record["step"], len(seen)))
    finally:
        gc.callbacks.remove(on_collection)
    return seen, records


def test_collections_are_young_generations_at_the_interval_with_the_automatic_collector_off(tmp_path):
    t = trainer(tmp_path, "gc-interval=2")
    assert gc.isenabled()
    seen, records = collections_during(t.steps(6))
    assert [r[0] for r in records] == [1, 2, 3, 4, 5, 6]
    assert seen == [(1, False)] * 3  # after steps 2, 4 and 6 were queued; nothing automatic, nothing full
    assert gc.isenabled()  # given back when the loop ends


def test_gc_interval_zero_leaves_the_automatic_collector_on(tmp_path):
    t = trainer(tmp_path, "gc-interval=0")
    states = []
    for _ in t.steps(3):
        states.append(gc.isenabled())
    assert states == [True, True, True]


def test_a_collector_turned_off_by_the_caller_stays_off(tmp_path):
    t = trainer(tmp_path, "gc-interval=2")
    gc.disable()
    try:
        seen, _ = collections_during(t.steps(4))
        assert seen == []  # the caller's choice: no collections, automatic or scheduled
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_comes_back_when_a_step_fails(tmp_path):
    t = trainer(tmp_path, "gc-interval=2")

    def failing(x, y, is_last):
        raise RuntimeError("out of memory")

    t.engine.micro_step = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        list(t.steps(4))
    assert gc.isenabled()


def test_a_negative_interval_is_a_usage_error():
    cfg, _ = load_config("gpt2-tiny", ["gc-interval=-1"])
    with pytest.raises(UsageError, match="gc-interval"):
        validate(cfg)


def test_an_error_in_the_training_loop_hands_the_collector_back_while_the_error_is_still_held(tmp_path):
    t = trainer(tmp_path, "gc-interval=2")
    real = t.metrics.write

    def failing(record):
        if record.get("step") == 3:
            raise OSError("disk full")
        real(record)

    t.metrics.write = failing
    with pytest.raises(OSError, match="disk full") as held:
        t.loop()
    assert held.value is not None and gc.isenabled()  # the traceback (and the loop's frame) still alive here
