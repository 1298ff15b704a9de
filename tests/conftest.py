"""Shared test helpers: run the installed ``gptforge`` entry point as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def gptforge_executable() -> list[str]:
    script = Path(sys.executable).parent / "gptforge"
    if script.exists():
        return [str(script)]
    found = shutil.which("gptforge")
    if found is None:
        pytest.fail("the gptforge entry point is not installed: pip install -e '.[test]'")
    return [found]


def run_cli(*args: str, env: dict | None = None, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``gptforge ARGS`` through the installed console script; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*gptforge_executable(), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )


@pytest.fixture
def cli():
    return run_cli
