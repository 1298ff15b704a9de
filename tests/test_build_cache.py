"""Wheel-cache key stability and the file lock: concurrent builders compile once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptforge.build.cache import WheelCache, cache_key

needs_c_toolchain = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("cc") is None
    or not Path(sysconfig.get_paths()["include"], "Python.h").exists(),
    reason="needs a C compiler and Python's headers (python3-dev) to build a real extension")

KEY_INPUTS = {"package": "apex", "source": "6424da3b4faa6c8f062da4a48c424fff3f02d42d", "torch": "2.11.0+cu130",
              "torch_cuda": "13.0", "python": "cp312-cp312-linux_x86_64", "arch_list": "9.0a",
              "flags": ["--cpp_ext", "--cuda_ext"]}
values = st.one_of(st.text(max_size=20), st.integers(), st.none(), st.lists(st.text(max_size=5), max_size=3))


def test_same_inputs_same_key_in_any_order():
    assert cache_key(KEY_INPUTS) == cache_key(dict(reversed(list(KEY_INPUTS.items()))))
    assert cache_key(KEY_INPUTS) == cache_key(json.loads(json.dumps(KEY_INPUTS)))


def test_key_is_stable_across_releases():
    """A cache shared by nodes running different gptforge versions must agree on keys: the key of
    fixed inputs never changes (changing the key scheme would orphan every shared cache)."""
    assert cache_key(KEY_INPUTS) == "b507c4efb26caf591e3b"


@given(st.sampled_from(sorted(KEY_INPUTS)), values)
def test_any_input_change_changes_the_key(field, value):
    changed = {**KEY_INPUTS, field: value}
    assert (cache_key(changed) == cache_key(KEY_INPUTS)) == (value == KEY_INPUTS[field])


def test_each_real_input_matters():
    for field, other in [("source", "0" * 40), ("torch", "2.11.0+cu128"), ("torch_cuda", "12.8"),
                         ("python", "cp311-cp311-linux_x86_64"), ("arch_list", "9.0"), ("flags", ["--cpp_ext"])]:
        assert cache_key({**KEY_INPUTS, field: other}) != cache_key(KEY_INPUTS), field


TINY_SETUP = """
from setuptools import Extension, setup
setup(name="tinyext", version="0.1", ext_modules=[Extension("tinyext", ["tiny.c"])])
"""
TINY_C = """
#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "tinyext", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_tinyext(void) { return PyModule_Create(&m); }
"""
BUILDER = """
import subprocess, sys, time
from pathlib import Path
from gptforge.build.cache import WheelCache
root, project, tag = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def build(work):
    (root / f"building-{tag}").write_text("")
    with open(root / "compiles.txt", "a") as fh:
        fh.write(tag + "\\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(work / "dist"), str(project)], check=True)
    time.sleep(2)  # keep the lock held long enough that the other builder certainly waits
    return next((work / "dist").glob("tinyext-*.whl"))
waited = []
entry = WheelCache(root, "tiny").get_or_build("k" * 20, {"tiny": 1}, build, on_wait=waited.append)
print(f"{tag} built={entry.built_here} waited={bool(waited)} wheel={entry.wheel.name}")
"""


def builders(tmp_path: Path, builder_source: str):
    """A tiny C extension project, a cache root and ``start(tag)`` launching a builder process on them."""
    project = tmp_path / "tiny"
    project.mkdir()
    (project / "setup.py").write_text(TINY_SETUP)
    (project / "tiny.c").write_text(textwrap.dedent(TINY_C))
    script = tmp_path / "builder.py"
    script.write_text(builder_source)
    root = tmp_path / "cache"
    root.mkdir()

    def start(tag: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), str(root), str(project), tag], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    return root, start


def wait_for(marker: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 60
    while not marker.exists():
        assert time.time() < deadline and proc.poll() is None, what
        time.sleep(0.05)


@needs_c_toolchain
def test_two_processes_sharing_a_cache_compile_once(tmp_path):
    root, start = builders(tmp_path, BUILDER)
    first = start("A")
    wait_for(root / "building-A", first, "builder A never started building")  # B starts once A holds the lock
    second = start("B")
    out_a, _ = first.communicate(timeout=120)
    out_b, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0
    assert (root / "compiles.txt").read_text().split() == ["A"]
    assert "built=True" in out_a
    assert "built=False waited=True" in out_b
    entry = WheelCache(root, "tiny").lookup("k" * 20)
    assert entry is not None and entry.wheel.name.startswith("tinyext-0.1-")
    assert not list((root / "tiny").glob(".tmp-*")), "work dirs are cleaned up"


@needs_c_toolchain
def test_a_killed_builder_releases_the_lock_and_the_next_one_builds(tmp_path):
    # A dies after its compile finished, still holding the lock (a killed builder's pip could otherwise
    # still be writing into its work dir).
    root, start = builders(tmp_path, BUILDER.replace(
        "time.sleep(2)", "(root / f'compiled-{tag}').write_text(''); time.sleep(600 if tag == 'A' else 0)"))
    first = start("A")
    wait_for(root / "compiled-A", first, "builder A never finished compiling")
    first.kill()  # SIGKILL while holding the lock, mid-build
    first.communicate()
    assert list((root / "tiny").glob(".tmp-*")), "A left its work dir behind"
    second = start("B")
    out_b, err_b = second.communicate(timeout=120)
    assert second.returncode == 0, err_b
    assert "B built=True" in out_b
    assert (root / "compiles.txt").read_text().split() == ["A", "B"]
    assert not list((root / "tiny").glob(".tmp-*")), "the dead builder's work dir is cleaned up"


def test_failed_build_publishes_nothing(tmp_path):
    cache = WheelCache(tmp_path, "x")

    def broken(work: Path) -> Path:
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="compiler exploded"):
        cache.get_or_build("f" * 20, {}, broken)
    assert cache.lookup("f" * 20) is None
    assert not [p for p in (tmp_path / "x").iterdir() if p.name.startswith(".tmp-")]


def _fake_wheel(work: Path) -> Path:
    wheel = work / "tiny-1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))
    return wheel


@pytest.mark.parametrize("damage", ["not-json", "deep", "a-list", "no-wheel-name", "wheel-outside", "fifo"])
def test_a_damaged_entry_is_built_again(tmp_path, damage):
    """A cache entry whose entry.json is damaged, or names a wheel outside the entry, is a miss, not a traceback:
    the build publishes a whole new entry over it."""
    cache = WheelCache(tmp_path, "x")
    key = "e" * 20
    cache.get_or_build(key, {}, _fake_wheel)
    meta = cache.entry_dir(key) / "entry.json"
    written = json.loads(meta.read_text())
    meta.unlink()
    if damage == "fifo":
        os.mkfifo(meta)
    else:
        meta.write_text({"not-json": "{", "deep": "[" * 100_000 + "]" * 100_000, "a-list": "[1]",
                         "no-wheel-name": json.dumps({**written, "wheel": 7}),
                         "wheel-outside": json.dumps({**written, "wheel": "../../outside.whl"})}[damage])
    (tmp_path / "outside.whl").write_bytes(b"x")
    assert cache.lookup(key) is None
    again = cache.get_or_build(key, {}, _fake_wheel)
    assert again.built_here and again.wheel.parent == cache.entry_dir(key)
