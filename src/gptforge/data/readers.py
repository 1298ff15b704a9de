"""Corpus readers: JSON lines, parquet and plain text, one document at a time.

Every reader yields ``Record(where, texts)``: ``where`` names the place in the input (``file:line``)
for error messages, ``texts`` holds one string per requested key. A line that cannot be used raises
``CorpusError`` naming ``file:line``, or is counted and skipped with ``skip_bad_lines``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from gptforge.errors import GptforgeError, UsageError
from gptforge.paths import not_a_file

FORMATS = ("jsonl", "parquet", "text")
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\ud800" escapes decode to these; UTF-8 cannot hold them
SUFFIX_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text"}


class CorpusError(GptforgeError):
    """The input corpus cannot be read as asked."""


@dataclass(frozen=True)
class Record:
    where: str
    texts: tuple[str, ...]


@dataclass
class SkipLog:
    """Bad lines skipped under ``--skip-bad-lines`` (the first few are kept for the report)."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(message)


def detect_format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
        return fmt
    found = SUFFIX_FORMATS.get(path.suffix.lower())
    if found is None:
        raise UsageError("--format", f"cannot tell the format of {path} from its suffix", f"pass --format ({', '.join(FORMATS)})")
    return found


def read_corpus(
    paths: Sequence[str | os.PathLike],
    *,
    fmt: str | None = None,
    json_keys: Sequence[str] = ("text",),
    skip_bad_lines: bool = False,
    skipped: SkipLog | None = None,
) -> Iterator[Record]:
    """All records of all inputs, in order."""
    skipped = skipped if skipped is not None else SkipLog()
    for raw in paths:
        path = Path(raw)
        problem = not_a_file(path)
        if problem:
            raise UsageError("--input", f"{path} {problem}", "give existing regular files")
        kind = detect_format(path, fmt)
        try:
            if kind == "jsonl":
                yield from _read_jsonl(path, json_keys, skip_bad_lines, skipped)
            elif kind == "parquet":
                yield from _read_parquet(path, json_keys, skip_bad_lines, skipped)
            else:
                yield from _read_text(path, json_keys)
        except OSError as err:  # unreadable, or an I/O error while reading
            raise CorpusError(f"{path}: {err.strerror or err}") from None


def _bad(message: str, skip: bool, skipped: SkipLog) -> None:
    if not skip:
        raise CorpusError(message, "fix the input or pass --skip-bad-lines to skip such lines")
    skipped.add(message)


def _texts(obj, keys: Sequence[str], where: str) -> tuple[str, ...] | str:
    """The requested fields of one record, or an error message."""
    if not isinstance(obj, dict):
        return f"{where}: expected a JSON object, got {type(obj).__name__}"
    texts = []
    for key in keys:
        if key not in obj:
            return f"{where}: no key {key!r} (keys: {', '.join(map(repr, list(obj)[:8])) or 'none'}; choose with --json-keys)"
        value = obj[key]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "".join(value)  # one document (Megatron tokenizes each item as a separate sentence)
        if not isinstance(value, str):
            return f"{where}: key {key!r} holds {type(value).__name__}, expected a string"
        surrogate = _SURROGATE.search(value)
        if surrogate:
            return (f"{where}: key {key!r} holds a lone surrogate \\u{ord(surrogate.group()):04x} at character "
                    f"{surrogate.start()} (an escape that is not Unicode text)")
        texts.append(value)
    return tuple(texts)


def _read_jsonl(path: Path, keys, skip: bool, skipped: SkipLog) -> Iterator[Record]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{path}:{number}"
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError as err:
                _bad(f"{where}: not UTF-8 ({err.reason} at byte {err.start})", skip, skipped)
                continue
            except json.JSONDecodeError as err:
                _bad(f"{where}: malformed JSON ({err.msg} at column {err.colno})", skip, skipped)
                continue
            except RecursionError:
                _bad(f"{where}: JSON nested too deeply to read", skip, skipped)
                continue
            except ValueError as err:  # an integer of more than sys.get_int_max_str_digits() digits
                _bad(f"{where}: unreadable JSON value ({str(err).split(';')[0]})", skip, skipped)
                continue
            texts = _texts(obj, keys, where)
            if isinstance(texts, str):
                _bad(texts, skip, skipped)
                continue
            yield Record(where, texts)


def _read_parquet(path: Path, keys, skip: bool, skipped: SkipLog) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("--format", f"{path}: reading parquet needs pyarrow", "pip install 'gptforge[parquet]'") from None

    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError variants
        raise CorpusError(f"{path}: not a readable parquet file ({err})") from None
    columns = parquet.schema_arrow.names
    missing = [k for k in keys if k not in columns]
    if missing:
        raise CorpusError(f"{path}: no column {missing[0]!r} (columns: {', '.join(columns)})", "choose the text column with --json-keys")
    row = 0
    for batch in parquet.iter_batches(columns=list(keys), batch_size=4096):
        values = [batch.column(k).to_pylist() for k in keys]
        for texts in zip(*values):
            row += 1
            where = f"{path}:row {row}"
            if any(not isinstance(t, str) for t in texts):
                _bad(f"{where}: a requested column is null or not a string", skip, skipped)
                continue
            yield Record(where, tuple(texts))


def _read_text(path: Path, keys) -> Iterator[Record]:
    """A plain text file is one document (for every key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    yield Record(f"{path}", tuple(text for _ in keys))
