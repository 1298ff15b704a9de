"""Run a tool the probe asks about (nvcc, a compiler): never raises, gives up after a short timeout (killing
what it started), and reads output that is not UTF-8 (a broken wrapper script may print anything)."""

from __future__ import annotations

from gptforge.process import run_bounded

TIMEOUT_S = 10  # `--version` answers in well under a second; the probes run in parallel


def run_tool(args: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); status -1 with the reason as stderr when it cannot run or times out."""
    done = run_bounded(args, TIMEOUT_S)
    return done.code, done.stdout, done.stderr
