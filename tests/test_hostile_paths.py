"""Planted links and misplaced files in a run directory and a prefix: refused in one line, nothing written,
read or deleted through them, outside the place the user named."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import main_one_line, snapshot, tiny_train_args
from gptforge.train import checkpoint

UNDO = os.path.join(".gptforge", "links-undo.json")


@pytest.fixture
def run(tiny_run_copy):
    return tiny_run_copy


def resume(run, cache, *extra, expect=1):
    return main_one_line(*tiny_train_args(run, cache, "--resume", "train-iters=8", *extra), expect=expect)


@pytest.mark.parametrize("resumed", [False, True], ids=["new-run", "resume"])
def test_a_planted_lock_link_is_refused(run, tmp_path, train_data_cache, resumed):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    if not resumed:
        run = tmp_path / "new"
        run.mkdir()
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(victim)
    if resumed:
        _, line = resume(run, train_data_cache)
    else:
        _, line = main_one_line(*tiny_train_args(run, train_data_cache, "train-iters=4"), expect=1)
    assert ".lock is a symbolic link" in line
    assert victim.read_text() == "keep"
    if not resumed:
        assert os.listdir(run) == [".lock"]  # nothing else written into the new run's directory


def test_a_planted_checkpoint_link_is_neither_loaded_nor_pruned(run, tmp_path, train_data_cache):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(checkpoint.latest(run / "checkpoints"), elsewhere / "step_00000004")
    (run / "checkpoints" / "step_00000009").symlink_to(elsewhere / "step_00000004")
    assert [p.name for p in checkpoint.complete_checkpoints(run / "checkpoints")] == ["step_00000004"]
    resume(run, train_data_cache, "keep-last=1", expect=0)
    assert (elsewhere / "step_00000004" / "trainer.pt").is_file()  # not deleted through the link
    assert os.path.islink(run / "checkpoints" / "step_00000009")
    assert checkpoint.latest(run / "checkpoints").name == "step_00000008"


def test_leftovers_that_are_links_are_removed_as_links(run, tmp_path, train_data_cache):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    for name in (".tmp-step_00000008", ".trash-step_00000004", ".latest.tmp-1"):
        (run / "checkpoints" / name).symlink_to(victim)
    resume(run, train_data_cache, expect=0)
    assert os.listdir(victim) == ["keep"]
    assert not [p for p in os.listdir(run / "checkpoints") if p.startswith(".")]


@pytest.mark.parametrize("name,make,words", [
    ("checkpoints", lambda p: p.write_text("x"), "checkpoints is not a directory"),
    ("metrics.jsonl", lambda p: p.mkdir(), "metrics.jsonl is a directory"),
    ("metrics.jsonl", lambda p: p.symlink_to(p.parent.parent / "victim"), "metrics.jsonl is a symbolic link"),
    ("tensorboard", lambda p: p.symlink_to(p.parent.parent), "tensorboard is a symbolic link"),
    ("config.json", lambda p: os.mkfifo(p), "config.json is not a regular file"),
])
def test_the_run_s_own_names_of_the_wrong_kind(run, train_data_cache, name, make, words):
    path = run / name
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    make(path)
    before = sorted(os.listdir(run.parent))
    _, line = resume(run, train_data_cache)
    assert words in line and "another --run-dir" in line
    assert sorted(os.listdir(run.parent)) == before


def test_metrics_that_are_binary_or_deep(run, train_data_cache):
    for text, words in ((b"\xff\xfe\x00\x01garbage\n{}\n", "metrics.jsonl line 1"),
                        (b"[" * 100_000 + b"]" * 100_000 + b"\n{}\n", "nested more than")):
        (run / "metrics.jsonl").write_bytes(text)
        _, line = resume(run, train_data_cache)
        assert words in line and "then --resume" in line


# fix-links: PREFIX/.gptforge is fix-links' own directory

def fix_links(*args, expect):
    return main_one_line("fix-links", *args, expect=expect)


def test_a_state_directory_link_is_refused(env, tmp_path):  # noqa: F811
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    os.symlink(elsewhere, os.path.join(env, ".gptforge"))
    before = snapshot(env)
    for args in ((), ("--undo",)):
        _, line = fix_links("--prefix", env, *args, expect=1)
        assert ".gptforge is a symbolic link" in line and "nothing was changed" in line
    assert snapshot(env) == before and os.listdir(elsewhere) == ["keep"]


def test_an_undo_record_link_is_refused(env, tmp_path):  # noqa: F811
    fix_links("--prefix", env, "--json", expect=0)
    record = os.path.join(env, UNDO)
    planted = tmp_path / "planted.json"
    shutil.move(record, planted)
    os.symlink(planted, record)
    _, line = fix_links("--prefix", env, "--undo", expect=1)
    assert "links-undo.json is a symbolic link" in line


def test_an_entry_without_after_removes_nothing(env):  # noqa: F811
    """The record cannot prove that fix-links made the link now there: undo leaves it and says what to do."""
    os.makedirs(os.path.join(env, ".gptforge"))
    theirs = os.path.join(env, "lib", "libtheirs.so")
    os.symlink("libcudart.so.12.4.127", theirs)
    with open(os.path.join(env, UNDO), "w") as f:
        json.dump({"format": 1, "prefix": env, "status": "complete",
                   "entries": [{"path": "lib/libtheirs.so", "before": {"kind": "absent"}}]}, f)
    code, out = main_one_line("fix-links", "--prefix", env, "--undo", "--json", expect=1, stream="stdout")
    found = json.loads(out)["findings"]
    assert [f["code"] for f in found] == ["links-undo-conflict"] and "by hand" in found[0]["fix"]
    assert os.readlink(theirs) == "libcudart.so.12.4.127"


def test_a_deep_undo_record(env):  # noqa: F811
    os.makedirs(os.path.join(env, ".gptforge"))
    with open(os.path.join(env, UNDO), "w") as f:
        f.write('{"a":' * 100_000 + "1" + "}" * 100_000)
    _, line = fix_links("--prefix", env, "--undo", expect=1)
    assert "cannot read the undo record" in line and "nested more than" in line
