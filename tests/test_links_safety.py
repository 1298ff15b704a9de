"""fix-links as an attacker would use it: a tampered undo record is refused whole, undo acts only
inside the prefix and only where the record still matches, system prefixes are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import ACTIVATION_VARS, run_main, snapshot

UNDO = os.path.join(".gptforge", "links-undo.json")


def fix_links(*args):
    """The command in this process (run_main), outside an active environment."""
    return run_main("fix-links", *args, env=dict.fromkeys(ACTIVATION_VARS))


def one_line_error(proc, *words, code=1):
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def repaired(env):  # noqa: F811
    proc = fix_links("--prefix", env, "--json")
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(env, UNDO)) as f:
        return env, json.load(f)


def entry(record, **changes):
    return {**record, "entries": [{**record["entries"][0], **changes}, *record["entries"][1:]]}


def shapes(record, outside):
    """Eighteen records fix-links never writes."""
    first = record["entries"][0]
    return {
        "not-json": "{not json",
        "a-list": [],
        "no-entries": {"format": 1},
        "entries-not-a-list": {**record, "entries": {"path": "lib"}},
        "entry-not-an-object": {**record, "entries": ["lib/libcudart.so"]},
        "path-missing": entry(record, path=None),
        "path-not-a-string": entry(record, path=7),
        "path-absolute": entry(record, path="/etc/cron.d/evil"),
        "path-dotdot": entry(record, path="../outside/libx.so"),
        "path-dotdot-inside": entry(record, path="lib/../../outside/libx.so"),
        "path-empty": entry(record, path=""),
        "path-dot": entry(record, path="."),
        "path-through-a-link-outside": entry(record, path=f"{outside}/libx.so"),
        "before-missing": {**record, "entries": [{"path": first["path"]}]},
        "before-not-an-object": entry(record, before="link"),
        "unknown-kind": entry(record, before={"kind": "socket"}),
        "link-without-target": entry(record, before={"kind": "link"}),
        "after-malformed": entry(record, after={"kind": "link", "target": 3}),
    }


SHAPES = shapes({"entries": [{"path": "lib/libcudart.so", "before": {"kind": "absent"}}]}, "x")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_malformed_record_is_refused_whole(repaired, tmp_path, shape):
    prefix, record = repaired
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, os.path.join(prefix, "escape"))  # a directory link leading out of the prefix
    bad = shapes(record, "escape")[shape]
    with open(os.path.join(prefix, UNDO), "w") as f:
        f.write(bad if isinstance(bad, str) else json.dumps(bad))
    before = snapshot(prefix)
    proc = fix_links("--prefix", prefix, "--undo")
    one_line_error(proc, "undo record", "nothing was changed" if shape != "not-json" else "cannot read")
    assert snapshot(prefix) == before and os.listdir(outside) == []


def test_an_absolute_record_path_cannot_touch_outside_files(repaired, tmp_path):
    prefix, record = repaired
    victim = tmp_path / "victim.so"
    os.symlink("original", victim)  # a link outside the prefix that a trusting undo would remove
    tampered = {**record, "entries": [{"path": str(victim), "before": {"kind": "absent"}}, *record["entries"]]}
    with open(os.path.join(prefix, UNDO), "w") as f:
        json.dump(tampered, f)
    one_line_error(fix_links("--prefix", prefix, "--undo"), "not a plain relative path")
    assert os.readlink(victim) == "original"


def test_undo_will_not_restore_a_link_that_leads_outside(repaired):
    prefix, record = repaired
    tampered = entry(record, before={"kind": "link", "target": "/etc/shadow"})
    with open(os.path.join(prefix, UNDO), "w") as f:
        json.dump(tampered, f)
    before = snapshot(prefix)
    proc = fix_links("--prefix", prefix, "--undo")
    assert proc.returncode == 1 and "links-outside-prefix" in proc.stdout and "/etc/shadow" in proc.stdout
    assert snapshot(prefix) == before


def test_undo_acts_only_where_the_record_still_matches(repaired):
    prefix, record = repaired
    first = os.path.join(prefix, record["entries"][0]["path"])
    assert record["entries"][0]["after"] == {"kind": "link", "target": os.readlink(first)}
    os.unlink(first)
    os.symlink("someone-elses-choice", first)  # changed by someone after fix-links
    before = snapshot(prefix)
    proc = fix_links("--prefix", prefix, "--undo")
    assert proc.returncode == 1 and "links-undo-conflict" in proc.stdout and "changed since fix-links" in proc.stdout
    assert snapshot(prefix) == before


def test_a_genuine_record_still_undoes(env):  # noqa: F811
    original = snapshot(env)
    assert fix_links("--prefix", env).returncode == 0
    proc = fix_links("--prefix", env, "--undo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(env) == original


@pytest.mark.parametrize("system", ["/", "/usr", "/usr/local", "/opt"])
def test_system_prefixes_are_refused(system):
    if not os.path.isdir(os.path.join(system, "lib")):
        pytest.skip(f"{system} has no lib/ here")
    one_line_error(fix_links("--prefix", system, "--cuda", "13.0", "--dry-run"), "system directory",
                   "--allow-system-prefix", code=2)
    allowed = fix_links("--prefix", system, "--cuda", "13.0", "--dry-run", "--allow-system-prefix", "--json")
    assert "system directory" not in allowed.stderr and json.loads(allowed.stdout)["prefix"] == os.path.realpath(system)


def test_full_disk_during_fix_links(env, tmp_path):  # noqa: F811
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        prefix = str(disk / "env")
        shutil.copytree(env, prefix, symlinks=True)
        (disk / "filler").write_bytes(b"\0" * shutil.disk_usage(disk).free)
        before = snapshot(prefix)
        proc = fix_links("--prefix", prefix)
        one_line_error(proc, "No space left on device", "free", prefix)
        assert snapshot(prefix) == before
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
