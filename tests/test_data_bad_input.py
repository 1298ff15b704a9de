"""Bad input: one-line error naming the problem, non-zero exit, no traceback, nothing half-written. The commands run
in this process (run_main), but for those with worker processes or a signal, which start the installed command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import gptforge_executable, run_cli, run_main
import numpy as np

from gptforge.data.indexed import IndexedDataset, read_tokenizer_record
from gptforge.data.prepare import prepare



@pytest.fixture
def cli():
    return run_main


def _one_line_error(proc, *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _listing(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}


@pytest.fixture
def good_prefix(tmp_path) -> Path:
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(10)))
    return prepare([tmp_path / "c.jsonl"], tmp_path / "good", append_eod=True, progress=False).prefixes["text"]


def test_truncated_bin(cli, good_prefix):
    data = Path(f"{good_prefix}.bin")
    data.write_bytes(data.read_bytes()[:-7])
    _one_line_error(cli("data", "inspect", str(good_prefix)), ".bin", "truncated", "bytes but the index describes")


def test_bin_with_trailing_bytes(cli, good_prefix):
    data = Path(f"{good_prefix}.bin")
    data.write_bytes(data.read_bytes() + b"\0\0")
    _one_line_error(cli("data", "inspect", str(good_prefix)), "trailing bytes")


def test_wrong_magic(cli, good_prefix):
    index = Path(f"{good_prefix}.idx")
    index.write_bytes(b"TNTIDX\0\0\0" + index.read_bytes()[9:])
    _one_line_error(cli("data", "inspect", str(good_prefix)), "wrong magic", "MMIDIDX")


def test_index_size_mismatch(cli, good_prefix):
    index = Path(f"{good_prefix}.idx")
    index.write_bytes(index.read_bytes()[:-8])
    _one_line_error(cli("data", "inspect", str(good_prefix)), "index size mismatch")


def test_truncated_index_header(cli, good_prefix):
    Path(f"{good_prefix}.idx").write_bytes(b"MMIDIDX\0\0\1")
    _one_line_error(cli("data", "inspect", str(good_prefix)), "truncated index header")


def test_missing_dataset(cli, tmp_path):
    _one_line_error(cli("data", "inspect", str(tmp_path / "nothing")), "not found")


def test_malformed_json_line_names_file_and_line(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": broken\n{"text": "after"}\n')
    before = _listing(tmp_path)
    line = _one_line_error(cli("prepare", "--input", str(bad), "--output-prefix", str(tmp_path / "out")),
                           f"{bad}:3", "malformed JSON", "--skip-bad-lines")
    assert line.startswith("gptforge: error:")
    assert _listing(tmp_path) == before


def test_skip_bad_lines_continues_and_counts(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n["not", "an object"]\n{"other": "no text key"}\n{"text": "after"}\n')
    proc = cli("prepare", "--input", str(bad), "--output-prefix", str(tmp_path / "out"), "--skip-bad-lines", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["documents"] == 2 and report["skipped_lines"] == 3
    assert f"{bad}:2" in report["first_skipped"][0]
    inspect = json.loads(cli("data", "inspect", str(tmp_path / "out_text_document"), "--json").stdout)
    assert inspect["documents"] == 2


def test_missing_key(cli, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"body": "text under another key"}\n')
    before = _listing(tmp_path)
    _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out")),
                    f"{src}:1", "no key 'text'", "'body'", "--json-keys")
    assert _listing(tmp_path) == before


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_corpus(cli, tmp_path, content):
    src = tmp_path / "empty.jsonl"
    src.write_text(content)
    before = _listing(tmp_path)
    _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out"), "--tokenizer", "bytelevel"),
                    "empty corpus")
    assert _listing(tmp_path) == before


def test_bad_line_late_in_corpus_leaves_nothing(cli, tmp_path):
    """The error surfaces after output files were opened: their temporary files must be gone."""
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3000)) + "{oops\n")
    before = _listing(tmp_path)
    _one_line_error(run_cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out"), "--workers", "2"),
                    f"{src}:3001")
    assert _listing(tmp_path) == before


def test_missing_input_and_unknown_format(cli, tmp_path):
    _one_line_error(cli("prepare", "--input", str(tmp_path / "nope.jsonl"), "--output-prefix", str(tmp_path / "o")), "not found")
    (tmp_path / "c.csv").write_text("a,b\n")
    _one_line_error(cli("prepare", "--input", str(tmp_path / "c.csv"), "--output-prefix", str(tmp_path / "o")), "--format")


def test_parquet_missing_column(cli, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "d.parquet")
    _one_line_error(cli("prepare", "--input", str(tmp_path / "d.parquet"), "--output-prefix", str(tmp_path / "o")),
                    "no column 'text'", "content")


def test_input_directory_is_named(cli, tmp_path):
    (tmp_path / "adir").mkdir()
    _one_line_error(cli("prepare", "--input", str(tmp_path / "adir"), "--output-prefix", str(tmp_path / "o")), "is a directory")


@pytest.mark.parametrize("content", ["", "\n"])
def test_empty_text_file_is_an_empty_corpus(cli, tmp_path, content):
    (tmp_path / "empty.txt").write_text(content if content else "")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": ""}\n')
    before = _listing(tmp_path)
    for name in ("empty.txt", "blank.jsonl") if not content else ("blank.jsonl",):
        _one_line_error(cli("prepare", "--input", str(tmp_path / name), "--output-prefix", str(tmp_path / "out")), "empty corpus")
    assert _listing(tmp_path) == before


def _bad_output_prefixes(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "adir").mkdir()
    return {
        "under a file": (str(tmp_path / "afile" / "out"), "is not a directory"),
        "symlink loop": (str(tmp_path / "loop" / "out"), "is not a directory"),
        "trailing slash": (str(tmp_path / "adir") + "/", "names a directory"),
    }


def test_bad_output_prefix_prepare(cli, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "hello"}\n')
    cases = _bad_output_prefixes(tmp_path)
    before = _listing(tmp_path)
    for prefix, needle in cases.values():
        for tokenizer in ("gpt2", "bytelevel"):
            _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", prefix, "--tokenizer", tokenizer), "--output-prefix", needle)
    assert _listing(tmp_path) == before


def test_bad_output_prefix_merge(cli, tmp_path, good_prefix):
    cases = _bad_output_prefixes(tmp_path)
    before = _listing(tmp_path)
    for prefix, needle in cases.values():
        _one_line_error(cli("data", "merge", "--input", str(good_prefix), "--output-prefix", prefix), "--output-prefix", needle)
    assert _listing(tmp_path) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a read-only directory")
def test_read_only_output_directory(cli, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "hello"}\n')
    (tmp_path / "ro").mkdir(mode=0o555)
    _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "ro" / "out")), "not writable")
    assert list((tmp_path / "ro").iterdir()) == []


def test_failure_after_training_removes_the_trained_tokenizer(tmp_path, monkeypatch):
    """An interrupted run leaves neither temporary data files nor the tokenizer it trained."""
    import gptforge.data.prepare as prepare_module

    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(50)))
    before = _listing(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([src], tmp_path / "out", tokenizer="bytelevel", vocab_size=300, progress=False)
    assert _listing(tmp_path) == before
    assert not (tmp_path / "out_tokenizer").exists()


def test_sigint_mid_prepare_leaves_nothing(tmp_path):
    """A real run interrupted while it writes (Ctrl-C: SIGINT to the process group, workers
    included): exit 130, one line, no output files. On a loaded machine the signal can land after
    the outputs were published (the run is then complete, not half-written): once, the test
    tries again with a corpus three times larger."""
    line = json.dumps({"text": "many words in a long document " * 60}) + "\n"
    for lines in (30_000, 90_000):
        work = tmp_path / str(lines)
        work.mkdir()
        src = work / "big.jsonl"
        src.write_text(line * lines)
        before = _listing(work)
        proc = subprocess.Popen(
            [*gptforge_executable(), "prepare", "--input", str(src), "--output-prefix", str(work / "out"), "--workers", "2"],
            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size for p in work.glob("*.partial-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "prepare finished before it could be interrupted; make the corpus larger"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        published = (work / "out_text_document.idx").is_file() and not list(work.glob("*.partial-*"))
        if proc.returncode in (0, -signal.SIGINT) and published:
            continue  # the signal came after the end
        assert proc.returncode == 130, err
        assert err.strip() == "gptforge: interrupted"
        assert _listing(work) == before
        return
    pytest.fail("both runs ended before the interrupt reached them")


def test_unusable_tokenizer_and_default_corpus_directories(cli, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "hello there, hello again"}\n')
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    before = _listing(tmp_path)
    for bad in (tmp_path / "afile", tmp_path / "loop" / "x"):
        _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "o"), "--tokenizer", "bytelevel",
                            "--vocab-size", "300", "--tokenizer-dir", str(bad)), "--tokenizer-dir", "no vocab.json")
        _one_line_error(cli("prepare", "--default-corpus", str(bad)), "--default-corpus", "cannot create")
    _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "o"),
                        "--vocab-file", str(tmp_path), "--merge-file", str(src)), "--vocab-file", "is a directory")
    assert _listing(tmp_path) == before


def test_prepare_creates_the_output_directory(cli, tmp_path):
    """The README's `--output-prefix data/owt` in a fresh clone: data/ is made, not demanded."""
    (tmp_path / "c.jsonl").write_text('{"text": "hello world"}\n')
    proc = cli("prepare", "--input", "c.jsonl", "--output-prefix", "data/deeper/owt", "--tokenizer", "gpt2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "deeper" / "owt_text_document.idx").is_file()


def test_failed_prepare_removes_the_directories_it_made(tmp_path, monkeypatch):
    import gptforge.data.prepare as prepare_module

    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "hello world"}\n')

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module, "_write_all", broken)
    with pytest.raises(Exception, match="No space left"):
        prepare([src], tmp_path / "new" / "dir" / "out", tokenizer="bytelevel", vocab_size=300, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_merge_refuses_datasets_of_different_tokenizers(cli, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} has some words"}) + "\n" for i in range(20)))
    gpt2 = prepare([src], tmp_path / "gpt2", tokenizer="gpt2", progress=False).prefixes["text"]
    again = prepare([src], tmp_path / "again", tokenizer="gpt2", progress=False).prefixes["text"]
    byte = prepare([src], tmp_path / "byte", tokenizer="bytelevel", vocab_size=300, progress=False).prefixes["text"]
    assert np.dtype(IndexedDataset(gpt2).dtype) == np.dtype(IndexedDataset(byte).dtype)  # dtype alone cannot tell
    before = _listing(tmp_path)
    _one_line_error(cli("data", "merge", "--input", str(gpt2), str(byte), "--output-prefix", str(tmp_path / "m")),
                    "made by another tokenizer", "bytelevel", "gpt2")
    assert _listing(tmp_path) == before
    ok = cli("data", "merge", "--input", str(gpt2), str(again), "--output-prefix", str(tmp_path / "m"))
    assert ok.returncode == 0, ok.stderr
    assert read_tokenizer_record(tmp_path / "m") == read_tokenizer_record(gpt2) != read_tokenizer_record(byte)


def test_inspect_accepts_the_bin_or_idx_file(cli, good_prefix):
    by_prefix = json.loads(cli("data", "inspect", str(good_prefix), "--json").stdout)
    for suffix in (".bin", ".idx"):
        proc = cli("data", "inspect", f"{good_prefix}{suffix}", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == by_prefix


def test_inspect_prints_the_whole_checksum(cli, good_prefix):
    """Read through a pipe, a table row is one line: the sha256 is whole, not cut to the width of a terminal."""
    digest = json.loads(cli("data", "inspect", str(good_prefix), "--json").stdout)["bin_sha256"]
    proc = cli("data", "inspect", str(good_prefix))
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if "bin sha256" in line]
    assert digest in row
