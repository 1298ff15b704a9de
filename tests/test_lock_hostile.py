"""`gptforge lock check` on damaged or hostile inputs: one line, a non-zero exit, no traceback, no hang,
nothing read without bound (a FIFO, /dev/zero)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BILLION_LAUGHS = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c]\n"


def _run(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "gptforge", "lock", "check", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _assert_one_line_failure(result):
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


LOCKS = {
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "truncated": None,
    "list": b"- 1\n- 2\n",
    "scalar": b"7\n",
    "python-tag": b"!!python/object/apply:os.system ['true']\n",
    "billion-laughs": BILLION_LAUGHS.encode(),
    "version-6": None,
    "unknown-platform": None,
    "unknown-environment": None,
    "evil-url": None,
}


@pytest.mark.parametrize("case", sorted(LOCKS))
def test_a_hostile_lock_is_one_line(workspace, case):
    lock = workspace / "pixi.lock"
    text = lock.read_text()
    data = LOCKS[case]
    if case == "truncated":
        data = text[: len(text) // 3].encode()
    elif case == "version-6":
        data = text.replace("version: 7", "version: 6", 1).encode()
    elif case == "unknown-platform":
        data = text.replace("      linux-64:\n", "      win-64:\n", 1).encode()
    elif case == "unknown-environment":
        data = text.replace("  cpu:\n", "  gone:\n", 1).encode()
    elif case == "evil-url":
        data = text.replace("- conda: https://conda.anaconda.org/conda-forge/", "- conda: file:///etc/../../", 1).encode()
    lock.write_bytes(data)
    result = _run("--manifest", str(workspace / "pixi.toml"))
    if case in ("unknown-environment", "version-6"):   # a finding, not a crash
        assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout
        return
    _assert_one_line_failure(result)


@pytest.mark.parametrize("what", ["pixi.lock", "pixi.toml"])
@pytest.mark.parametrize("kind", ["directory", "missing", "dev-zero", "fifo"])
def test_not_a_regular_file_is_refused_without_reading(workspace, what, kind):
    target = workspace / what
    target.unlink()
    if kind == "directory":
        target.mkdir()
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(target)
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml"), timeout=60))


def test_a_hostile_manifest_is_one_line(workspace):
    (workspace / "pixi.toml").write_text("[workspace\nchannels = [")
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml")))


def test_a_damaged_recorded_repodata_fails_the_check(workspace):
    (workspace / "envs/records/conda-forge/linux-64/repodata.json").write_text("{")
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml")))
