"""prepare and data merge never lose a user's data: inputs are only read, the .bin/.idx pair is
published as a pair, and interrupted or killed runs leave nothing that a later run trusts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gptforge.data.indexed as indexed
import gptforge.data.indexed_writer as indexed_writer
from conftest import gptforge_executable, run_cli
from gptforge.data.indexed import IndexedDataset, IndexedDatasetError
from gptforge.data.prepare import prepare


def contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(proc, *words):
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"document number {i} with some words"}) + "\n" for i in range(60)))
    return path


def test_a_users_tokenizer_directory_is_never_written(cli, tmp_path, corpus):
    user = tmp_path / "hf-tokenizer"  # a Hugging Face directory without vocab.json
    user.mkdir()
    (user / "merges.txt").write_text("#version: 0.2\nmy merges\n")
    (user / "tokenizer_config.json").write_text('{"mine": true}\n')
    before = contents(user)
    proc = cli("prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out"), "--tokenizer", "bytelevel",
               "--vocab-size", "300", "--tokenizer-dir", str(user))
    one_line_error(proc, "--tokenizer-dir", "no vocab.json", "never writes")
    assert contents(user) == before
    assert not list(tmp_path.glob("out_*"))


def test_a_trained_tokenizer_goes_beside_the_output(tmp_path, corpus):
    result = prepare([corpus], tmp_path / "out", tokenizer="bytelevel", vocab_size=300, progress=False)
    assert result.tokenizer_dir == tmp_path / "out_tokenizer" and result.trained_tokenizer
    assert (tmp_path / "out_tokenizer" / "vocab.json").is_file()
    assert not list(tmp_path.glob("*.partial-*"))


def test_an_output_that_is_an_input_is_refused(cli, tmp_path, corpus):
    first = prepare([corpus], tmp_path / "X", progress=False).prefixes["text"]
    data = Path(f"{first}.bin")
    data_copy = tmp_path / "copy.jsonl"
    data_copy.write_bytes(corpus.read_bytes())
    before = contents(tmp_path)
    one_line_error(cli("prepare", "--input", str(data), "--format", "jsonl", "--output-prefix", str(tmp_path / "X")),
                   "--output-prefix", "would overwrite the input", str(data))
    os.symlink(data_copy, tmp_path / "Y_text_document.bin")  # the same file under another name
    one_line_error(cli("prepare", "--input", str(data_copy), "--output-prefix", str(tmp_path / "Y")), "would overwrite")
    one_line_error(cli("data", "merge", "--input", str(first), "--output-prefix", str(first)), "would overwrite the input")
    (tmp_path / "Y_text_document.bin").unlink()
    assert contents(tmp_path) == before


@pytest.mark.parametrize("command", ["prepare", "merge"])
def test_a_failed_publish_keeps_the_old_pair(tmp_path, corpus, monkeypatch, command):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"text": "an entirely different corpus " * 30}) + "\n")
    source = prepare([other], tmp_path / "src", progress=False).prefixes["text"]
    old = prepare([corpus], tmp_path / "out", progress=False).prefixes["text"]
    before = contents(tmp_path)
    real_replace = os.replace

    def idx_rename_fails(src, dst):
        if str(dst).endswith(".idx"):
            raise OSError(28, "No space left on device", str(src))
        return real_replace(src, dst)

    monkeypatch.setattr(indexed_writer.os, "replace", idx_rename_fails)
    with pytest.raises(IndexedDatasetError) as err:
        if command == "prepare":
            prepare([other], tmp_path / "out", progress=False)
        else:
            indexed_writer.merge_datasets([source], old)
    monkeypatch.undo()
    assert f"{old}.idx" in err.value.one_line() and "unchanged" in err.value.one_line()
    assert contents(tmp_path) == before  # the old pair, byte for byte, and no temporary file
    assert len(IndexedDataset(old)) == 60


def test_a_reader_never_opens_half_a_publish(tmp_path, corpus):
    old = prepare([corpus], tmp_path / "out", progress=False).prefixes["text"]
    opened = []
    with indexed.pair_lock(old, exclusive=True):  # what publish holds between its two renames
        reader = threading.Thread(target=lambda: opened.append(len(IndexedDataset(old))))
        reader.start()
        reader.join(0.5)
        assert opened == []  # waits for the publisher instead of reading a mix
    reader.join(10)
    assert opened == [60]


def test_sigterm_mid_prepare_leaves_nothing(tmp_path):
    src = tmp_path / "big.jsonl"
    src.write_text((json.dumps({"text": "many words in a long document " * 60}) + "\n") * 6_000)  # seconds of encoding
    before = contents(tmp_path)
    proc = subprocess.Popen([*gptforge_executable(), "prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out"),
                             "--tokenizer", "bytelevel", "--vocab-size", "300"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(p.is_file() and p.stat().st_size for p in tmp_path.glob("*.partial-*")) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "prepare finished before it could be stopped; make the corpus larger"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["gptforge: error: terminated (SIGTERM); the partial outputs were removed (rerun prepare)"]
    assert contents(tmp_path) == before


def test_leftovers_of_dead_processes_are_removed_and_never_reused(tmp_path, corpus):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_bin = tmp_path / f"out_text_document.bin.partial-{dead.pid}"
    stale_bin.write_bytes(b"half")
    stale_tok = tmp_path / f"out_tokenizer.partial-{dead.pid}"
    stale_tok.mkdir()
    (stale_tok / "vocab.json").write_text("{}")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    live = tmp_path / f"out_text_document.idx.partial-{running.pid}"  # a running process's: not touched
    live.write_bytes(b"busy")
    try:
        result = prepare([corpus], tmp_path / "out", tokenizer="bytelevel", vocab_size=300, progress=False)
    finally:
        running.kill()
        running.wait()
    assert result.trained_tokenizer and not stale_bin.exists() and not stale_tok.exists()
    assert live.read_bytes() == b"busy"


def test_full_disk_during_tokenizer_save(tmp_path, corpus):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (disk / "filler").write_bytes(b"\0" * shutil.disk_usage(disk).free)
        proc = run_cli("prepare", "--input", str(corpus), "--output-prefix", str(disk / "out"), "--tokenizer", "bytelevel",
                       "--vocab-size", "300")
        one_line_error(proc, "No space left on device", "free", str(disk / "out_tokenizer"))
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
