"""`gptforge lock check` on damaged or hostile inputs: one line, a non-zero exit, no traceback, no hang,
nothing read without bound (a FIFO, /dev/zero)."""

import json
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
    "deep": b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
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


MANIFESTS = {
    "truncated": lambda text: "[workspace\nchannels = [",
    "deep": lambda text: "a = " + "[" * 100_000 + "]" * 100_000,
    "unknown-feature": lambda text: text.replace('cpu = { features = ["cpu"]', 'cpu = { features = ["gone", "cpu"]', 1),
    "wrong-kind": lambda text: text.replace('cpu = { features = ["cpu"], solve-group = "cpu" }', "cpu = 7", 1),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_a_hostile_manifest_is_one_line(workspace, case):
    manifest = workspace / "pixi.toml"
    changed = MANIFESTS[case](manifest.read_text())
    assert changed != manifest.read_text()
    manifest.write_text(changed)
    _assert_one_line_failure(_run("--manifest", str(manifest)))


@pytest.mark.parametrize("case", ["deep", "no-project"])
def test_a_hostile_pyproject_is_one_line(workspace, case):
    (workspace / "pyproject.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 if case == "deep" else "[tool]\n")
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml")))


def test_an_export_that_is_not_text_is_a_finding(workspace):
    (workspace / "envs/cpu/conda-lock.yml").write_bytes(b"\xff\xfe" * 1000)
    result = _run("--manifest", str(workspace / "pixi.toml"), "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert [p["code"] for p in json.loads(result.stdout)["problems"]] == ["export-stale"]


@pytest.mark.parametrize("case", ["fifo", "missing-fields", "huge-field"])
def test_a_hostile_record_table_is_one_line(workspace, case):
    table = workspace / "envs/records/records.tsv"
    table.unlink()
    if case == "fifo":
        os.mkfifo(table)
    else:
        table.write_text("subdir\tfile_name\nlinux-64\tx.conda\n" if case == "missing-fields" else "a\n" + "x" * 200_000 + "\n")
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml"), timeout=60))


def test_a_damaged_recorded_repodata_fails_the_check(workspace):
    (workspace / "envs/records/conda-forge/linux-64/repodata.json").write_text("{")
    _assert_one_line_failure(_run("--manifest", str(workspace / "pixi.toml")))
