"""Fault injection for the resume tests: GPTFORGE_TEST_KILL_AT=step:N or save:N makes the process
SIGKILL itself in the middle of step N (after backward, before the optimizer) or in the middle of
writing the checkpoint of step N (after the model file, before the rest). Unset: does nothing."""

from __future__ import annotations

import os
import signal

ENV = "GPTFORGE_TEST_KILL_AT"


def maybe_kill(point: str, step: int) -> None:
    target = os.environ.get(ENV)
    if target and target == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
