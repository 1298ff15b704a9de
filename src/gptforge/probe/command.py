"""Run a tool the probe asks about (nvcc, a compiler): never raises, gives up after a timeout, and reads
output that is not UTF-8 (a broken wrapper script may print anything)."""

from __future__ import annotations

import subprocess

TIMEOUT_S = 30


def run_tool(args: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); status -1 with the reason as stderr when it cannot run or times out."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return -1, "", str(err)
    return done.returncode, done.stdout, done.stderr
