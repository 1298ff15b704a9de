"""Crash safety: the process SIGKILLs itself after the k-th file-system change (for every k of a
run), then the prefix is checked, the repair rerun, and --undo compared with the original. The killed runs are
processes of their own; the runs after them run in the test's process (run_main)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import dangling, install_library, run_cli, run_main, snapshot, symlink, write

CRASH = "GPTFORGE_TEST_KILL_AT"


@pytest.fixture
def broken_prefix(tmp_path):
    """A prefix with most kinds of trouble: decoy runtime behind libcudart.so, wrong SONAME link,
    cyclic and dangling links, no lib64, headers only under targets/."""
    prefix = str(tmp_path / "env")
    install_library(prefix, "libcudart", (13, 0, 96))
    install_library(prefix, "libcudart", (12, 8, 90), place="lib")
    symlink("libcudart.so.12.8.90", os.path.join(prefix, "lib", "libcudart.so"))
    symlink("libcudart.so.12.8.90", os.path.join(prefix, "lib", "libcudart.so.13"))
    install_library(prefix, "libcublas", (13, 0, 0, 19))
    symlink("libcublas.so.13.loop", os.path.join(prefix, "lib", "libcublas.so"))
    symlink("libcublas.so", os.path.join(prefix, "lib", "libcublas.so.13.loop"))
    install_library(prefix, "libcudnn", (9, 1, 0, 70), place="lib")
    install_library(prefix, "libcudnn", (9, 10, 2, 21))
    symlink("libcudnn.so.9.99.gone", os.path.join(prefix, "lib", "libcudnn.so.9"))
    symlink("libnvJitLink.so.12.0.1", os.path.join(prefix, "lib", "libnvJitLink.so.12"))  # dangling, no family file
    for name in ("cuda_runtime.h", "cuda.h", "crt/host_config.h", "cooperative_groups/details/sync.h"):
        write(os.path.join(prefix, "targets/x86_64-linux/include", name), f"/* {name} */\n".encode())
    write(os.path.join(prefix, "include", "Python.h"), b"/* python */\n")
    write(os.path.join(prefix, "conda-meta", "cuda-version-13.0-h0.json"), b'{"version": "13.0"}')
    return prefix


def dangling_of(snap: dict, prefix: str) -> set[str]:
    """Names that were dangling links in the prefix state ``snap`` (judged by the link texts)."""
    out = set()
    for rel, kind in snap.items():
        if kind[0] == "link":
            seen, cur = set(), rel
            while cur in snap and snap[cur][0] == "link" and cur not in seen:
                seen.add(cur)
                cur = os.path.normpath(os.path.join(os.path.dirname(cur), snap[cur][1]))
            if cur not in snap or cur in seen:
                out.add(rel)
    return out


def _names_missing(before: dict, after: dict) -> set[str]:
    return {rel for rel in before if rel not in after}


def _changes_of_full_run(prefix: str) -> int:
    """How many file-system changes a full run makes (runs on a copy-free dry count: crash points
    beyond the last one simply complete)."""
    report = json.loads(run_cli("fix-links", "--prefix", prefix, "--dry-run", "--json").stdout)
    links = sum(1 for s in report["steps"] if s["action"] == "link")
    return 3 * links + 1  # record write + temp link + rename per link, final record write


@pytest.mark.slow  # a run per crash point, each rerun and undone; the undo crash test below stays in the default run
def test_killed_at_every_step_leaves_valid_links_and_recovers(broken_prefix, tmp_path):
    prefix = broken_prefix
    original = snapshot(prefix)
    original_dangling = dangling(prefix)
    total = _changes_of_full_run(prefix)
    assert total > 10
    for k in range(1, total + 1):
        out = run_cli("fix-links", "--prefix", prefix, env={CRASH: f"change:{k}"})
        assert out.returncode == -signal.SIGKILL, f"crash point {k} of {total} was not reached: {out.stdout}"
        now = snapshot(prefix)
        assert not _names_missing(original, now), f"k={k}: names vanished"
        assert dangling(prefix) <= original_dangling, f"k={k}: new dangling links {dangling(prefix) - original_dangling}"
        assert {r: v for r, v in now.items() if v[0] == "file" and not r.startswith(".gptforge")} == \
            {r: v for r, v in original.items() if v[0] == "file"}
        if k % 2 == 0 or k == total:  # even k: rerun, then undo; odd k: undo straight after the crash (every phase of a step gets both)
            rerun = run_cli("fix-links", "--prefix", prefix, "--json")
            assert rerun.returncode == 0, rerun.stdout + rerun.stderr
            assert json.loads(run_cli("fix-links", "--prefix", prefix, "--json").stdout)["steps"] == []
            undone = run_cli("fix-links", "--prefix", prefix, "--undo")
            assert undone.returncode == 0, undone.stdout + undone.stderr
            assert snapshot(prefix) == original, f"k={k}: --undo did not restore the original state"
        else:
            undone = run_cli("fix-links", "--prefix", prefix, "--undo")
            assert undone.returncode == 0, undone.stdout + undone.stderr
            assert snapshot(prefix) == original, f"k={k}: --undo after a crash did not restore the original"
    final = run_cli("fix-links", "--prefix", prefix, env={CRASH: f"change:{total + 1}"})
    assert final.returncode == 0, final.stdout + final.stderr


def test_killed_during_undo_then_undo_again(broken_prefix):
    prefix = broken_prefix
    original = snapshot(prefix)
    assert run_main("fix-links", "--prefix", prefix).returncode == 0
    fixed = snapshot(prefix)
    allowed_dangling = dangling(prefix) | {rel for rel in original if rel in dangling_of(original, prefix)}
    k = 1
    while True:
        out = run_cli("fix-links", "--prefix", prefix, "--undo", env={CRASH: f"change:{k}"})
        if out.returncode == 0:
            break
        assert out.returncode == -signal.SIGKILL
        assert not _names_missing({r: v for r, v in original.items() if r in fixed}, snapshot(prefix))
        now = snapshot(prefix)
        restoring = {original[rel][1] for rel in dangling_of(original, prefix)}
        new = {rel for rel in dangling(prefix) - allowed_dangling
               if not (".gptforge-tmp." in rel and now[rel][1] in restoring)}  # an originally dangling link being put back
        assert not new, f"undo killed at {k} left new dangling links {new}"
        assert run_main("fix-links", "--prefix", prefix, "--undo").returncode == 0
        assert snapshot(prefix) == original, f"undo interrupted at {k} then rerun did not restore"
        assert run_main("fix-links", "--prefix", prefix).returncode == 0
        k += 1
    assert snapshot(prefix) == original
    assert k > 5
