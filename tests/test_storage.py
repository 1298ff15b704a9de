"""storage: atomic writes, published directories, the locked build-once cache, the gptforge cache root."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from gptforge.build.cache import default_cache_root
from gptforge.build.helpers import cache_root as helpers_root
from gptforge.storage import atomic_path, build_once, cache_dir, publish_dir, write_atomic


def test_gptforge_cache_is_the_root_of_every_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    assert (default_cache_root(), helpers_root()) == (tmp_path / "wheels", tmp_path / "helpers")
    monkeypatch.delenv("GPTFORGE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("wheels") == tmp_path / "xdg" / "gptforge" / "wheels"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "table.json"
    write_atomic(path, b"old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["table.json"]


def test_publish_dir_replaces_a_tree_whole(tmp_path):
    final, stage = tmp_path / "entry", tmp_path / ".stage"
    final.mkdir()
    (final / "old.whl").write_text("old")
    stage.mkdir()
    (stage / "new.whl").write_text("new")
    publish_dir(stage, final, replace=True)
    assert os.listdir(final) == ["new.whl"] and sorted(os.listdir(tmp_path)) == ["entry"]


def _builder(root: str, barrier) -> None:
    def lookup():
        return (root_path / "entry").read_text() if (root_path / "entry").is_file() else None

    def build():
        with open(root_path / "builds", "a") as log:
            log.write(f"{os.getpid()}\n")
        write_atomic(root_path / "entry", b"built")
        return "built"

    root_path = Path(root)
    barrier.wait()
    assert build_once(root_path / "entry.lock", lookup, build) == "built"


def test_build_once_builds_once_across_processes(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_builder, args=(str(tmp_path), barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert len((tmp_path / "builds").read_text().split()) == 1


def test_build_once_names_an_unwritable_cache_in_the_callers_words(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot lock"):
        build_once(blocker / "x.lock", lambda: None, lambda: "never", unwritable=lambda err: ValueError(f"cannot lock: {err}"))
