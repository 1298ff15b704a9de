"""`gptforge lock check`, and the maintainers' import of public locks (tasks/import_records.py), on damaged or
hostile inputs: one line, a non-zero exit, no traceback, no hang, nothing read without bound (a FIFO, /dev/zero)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import snapshot

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


def hostile_lock(text: str, case: str) -> bytes:
    """LOCKS[case], or the project's lock TEXT changed as the case says."""
    changes = {"truncated": lambda: text[: len(text) // 3],
               "version-6": lambda: text.replace("version: 7", "version: 6", 1),
               "unknown-platform": lambda: text.replace("      linux-64:\n", "      win-64:\n", 1),
               "unknown-environment": lambda: text.replace("  cpu:\n", "  gone:\n", 1),
               "evil-url": lambda: text.replace("- conda: https://conda.anaconda.org/conda-forge/", "- conda: file:///etc/../../", 1)}
    return changes[case]().encode() if case in changes else LOCKS[case]


@pytest.mark.parametrize("case", sorted(LOCKS))
def test_a_hostile_lock_is_one_line(workspace, case):
    lock = workspace / "pixi.lock"
    lock.write_bytes(hostile_lock(lock.read_text(), case))
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


# The maintainers' import of public locks into the record store (tasks/import_records.py) reads the same kinds of file

def _import_records(workspace, sources, mapping):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tasks")])}
    return subprocess.run([sys.executable, str(ROOT / "tasks" / "import_records.py"), str(sources), "--mapping", str(mapping),
                           "--mapping-source", "https://example.invalid/mapping.json"],
                          cwd=workspace, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("case", sorted(LOCKS) + ["directory", "missing", "fifo", "mapping-a-list", "provenance-short"])
def test_import_records_of_a_hostile_source(workspace, tmp_path, case):
    sources, mapping = tmp_path / "sources", tmp_path / "mapping.json"
    sources.mkdir()
    provenance = "blob\trepository\tcommit\tpath\nb1\towner/repo\tabc\tpixi.lock\n"
    (sources / "PROVENANCE.tsv").write_text(provenance if case != "provenance-short" else "blob\tpath\nb1\tpixi.lock\n")
    mapping.write_text("[1]" if case == "mapping-a-list" else "{}")
    lock = sources / "b1.lock"
    if case in LOCKS:
        lock.write_bytes(hostile_lock((workspace / "pixi.lock").read_text(), case))
    elif case == "directory":
        lock.mkdir()
    elif case == "fifo":
        os.mkfifo(lock)
    elif case != "missing":
        shutil.copy(workspace / "pixi.lock", lock)
    before = snapshot(str(workspace / "envs" / "records"))
    result = _import_records(workspace, sources, mapping)
    assert "Traceback" not in result.stderr, result.stderr
    if result.returncode != 0 or case in ("directory", "missing", "fifo", "mapping-a-list", "provenance-short"):
        _assert_one_line_failure(result)
        assert snapshot(str(workspace / "envs" / "records")) == before  # nothing half-written
