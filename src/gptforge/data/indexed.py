"""Megatron's memory-mapped indexed dataset (MMIDIDX v1): reader, writer and validation.

Layout of ``PREFIX.idx`` (little-endian): 9-byte magic ``MMIDIDX\\0\\0``, u64 version (1), u8 dtype
code, u64 sequence count S, u64 document-index length D (= documents + 1), int32[S] sequence
lengths, int64[S] byte pointers into ``PREFIX.bin``, int64[D] document boundaries (sequence ids),
optionally int8[S] sequence modes (multimodal datasets). ``PREFIX.bin`` is the raw concatenation of
every sequence's tokens in the index dtype. Same files as ``megatron/core/datasets/indexed_dataset.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.paths import not_a_file
from gptforge.reading import read_json
from gptforge.storage import write_failed

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34  # magic 9 + version 8 + dtype 1 + sequence count 8 + document count 8
TOKENIZER_IDENTITY = ("vocab_sha256", "merges_sha256")  # two datasets with equal values share a tokenizer

DTYPE_BY_CODE: dict[int, type] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_BY_DTYPE = {np.dtype(t): c for c, t in DTYPE_BY_CODE.items()}


class IndexedDatasetError(GptforgeError):
    """A .bin/.idx pair is missing, truncated or inconsistent."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message, fix or "the pair is damaged or was not written by gptforge prepare (nor Megatron): "
                                         "`gptforge data inspect PREFIX` names the defect; re-run gptforge prepare")


def optimal_dtype(vocab_size: int) -> np.dtype:
    """Token dtype for a vocabulary, chosen like Megatron's ``DType.optimal_dtype``."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def bin_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def meta_path(prefix: str | os.PathLike) -> Path:
    """gptforge's metadata beside a pair (Megatron's files have none): the tokenizer that made it."""
    return Path(f"{os.fspath(prefix)}.meta.json")


def read_tokenizer_record(prefix: str | os.PathLike) -> dict | None:
    """The tokenizer recorded for a dataset, or None (a dataset made elsewhere, e.g. by Megatron)."""
    path = meta_path(prefix)
    if not path.is_file():
        return None
    try:
        record = read_json(path, max_bytes=1 << 20, expect=dict, fix="remove it or re-run gptforge prepare").get("tokenizer")
    except FileReadError as err:
        raise IndexedDatasetError(err.message, err.fix) from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in TOKENIZER_IDENTITY):
        raise IndexedDatasetError(f"{path}: the tokenizer record lacks {', '.join(TOKENIZER_IDENTITY)}", "re-run gptforge prepare")
    return record


def as_prefix(path: str | os.PathLike) -> str:
    """The dataset prefix of ``path``: itself, or without ``.bin``/``.idx`` when it names one of the files."""
    text = os.fspath(path)
    stem, suffix = os.path.splitext(text)
    if suffix in (".bin", ".idx") and not idx_path(text).exists():
        return stem
    return text


def check_output_prefix(prefix: str | os.PathLike, flag: str = "--output-prefix") -> None:
    """Refuse an output prefix that cannot be written, before any work is done.

    Missing directories are fine (``output_directory`` creates them) when the nearest existing one
    is a writable directory.
    """
    text = os.fspath(prefix)
    if not text or text.endswith(("/", os.sep)):
        raise UsageError(flag, f"{text!r} names a directory, not a file prefix", f"add a name, e.g. {os.path.join(text or '.', 'corpus')}")
    existing = Path(text).absolute().parent
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(flag, f"{existing} is not a directory", "put the prefix in a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(flag, f"{existing} is not writable", "choose a directory you can write to")


@contextlib.contextmanager
def output_directory(prefix: str | os.PathLike) -> Iterator[None]:
    """Create the prefix's missing directories; when the body fails, remove those left empty."""
    missing, parent = [], Path(os.fspath(prefix)).absolute().parent
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    try:
        Path(os.fspath(prefix)).parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for directory in missing:  # deepest first
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


@contextlib.contextmanager
def pair_lock(prefix: str | os.PathLike, *, exclusive: bool):
    """An flock on the pair's directory: a publisher holds it exclusively while it renames the two
    files, readers share it while they open them, so a reader gets the old pair or the new one."""
    fd = os.open(Path(os.fspath(prefix)).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # drops the lock


@dataclass(frozen=True)
class Index:
    """The parsed ``.idx`` file (arrays are read-only views of a memory map)."""

    dtype: np.dtype
    sequence_lengths: np.ndarray  # int32[S]
    sequence_pointers: np.ndarray  # int64[S]
    document_indices: np.ndarray  # int64[D]
    sequence_modes: np.ndarray | None  # int8[S] or None


def read_index(path: str | os.PathLike, *, check_pointers: bool = True) -> Index:
    """Parse and validate an ``.idx`` file; every inconsistency raises one named error."""
    path = Path(path)
    problem = not_a_file(path)
    if problem:
        raise IndexedDatasetError(f"{path} {problem}", "pass the prefix without .bin/.idx, e.g. data/my_text_document")
    size = path.stat().st_size
    if size < HEADER_SIZE:
        raise IndexedDatasetError(f"{path}: truncated index header ({size} bytes, need {HEADER_SIZE})", "re-run gptforge prepare")
    with open(path, "rb") as f:
        header = f.read(HEADER_SIZE)
    if header[:9] != MAGIC:
        raise IndexedDatasetError(
            f"{path}: wrong magic {header[:9]!r}, expected {MAGIC!r}",
            "this is not a Megatron mmap index (MMIDIDX); re-create it with gptforge prepare",
        )
    (version,) = struct.unpack("<Q", header[9:17])
    if version != VERSION:
        raise IndexedDatasetError(f"{path}: index version {version}, only version {VERSION} is supported")
    code = header[17]
    if code not in DTYPE_BY_CODE:
        raise IndexedDatasetError(f"{path}: unknown dtype code {code} (known: {sorted(DTYPE_BY_CODE)})")
    sequence_count, document_count = struct.unpack("<QQ", header[18:34])
    plain = HEADER_SIZE + 12 * sequence_count + 8 * document_count
    if size not in (plain, plain + sequence_count):
        raise IndexedDatasetError(
            f"{path}: index size mismatch: header declares {sequence_count} sequences and "
            f"{document_count} document boundaries ({plain} bytes) but the file has {size} bytes",
            "the index is truncated or corrupt; re-run gptforge prepare",
        )
    buffer = np.memmap(path, mode="r", dtype=np.uint8)
    lengths = np.frombuffer(buffer, np.int32, sequence_count, HEADER_SIZE)
    pointers = np.frombuffer(buffer, np.int64, sequence_count, HEADER_SIZE + 4 * sequence_count)
    documents = np.frombuffer(buffer, np.int64, document_count, HEADER_SIZE + 12 * sequence_count)
    modes = np.frombuffer(buffer, np.int8, sequence_count, plain) if size > plain else None
    _check_documents(path, documents, sequence_count)
    dtype = np.dtype(DTYPE_BY_CODE[code])
    if check_pointers:
        _check_pointers(path, lengths, pointers, dtype.itemsize)
    return Index(dtype, lengths, pointers, documents, modes)


def _check_documents(path: Path, documents: np.ndarray, sequence_count: int) -> None:
    if len(documents) == 0 or documents[0] != 0:
        raise IndexedDatasetError(f"{path}: document index must start with 0")
    if documents[-1] != sequence_count:
        raise IndexedDatasetError(
            f"{path}: document index ends at {documents[-1]} but there are {sequence_count} sequences"
        )
    if len(documents) > 1 and np.any(np.diff(documents) < 0):
        raise IndexedDatasetError(f"{path}: document index is not non-decreasing")


def _check_pointers(path: Path, lengths: np.ndarray, pointers: np.ndarray, itemsize: int) -> None:
    if len(lengths) == 0:
        return
    if np.any(lengths < 0):
        raise IndexedDatasetError(f"{path}: negative sequence length at sequence {int(np.argmax(lengths < 0))}")
    expected = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=expected[1:])
    bad = np.flatnonzero(expected != pointers)
    if len(bad):
        raise IndexedDatasetError(
            f"{path}: sequence pointer {int(bad[0])} is {int(pointers[bad[0]])}, expected {int(expected[bad[0]])}"
        )


def expected_bin_size(index: Index) -> int:
    return int(index.sequence_lengths.sum(dtype=np.int64)) * index.dtype.itemsize


class IndexedDataset:
    """Zero-copy, memory-mapped random access to the sequences of ``PREFIX.bin/.idx``.

    ``ds[i]`` is sequence ``i`` as a read-only NumPy view of the memory map; a slice gives a list;
    ``ds.get(i, offset, length)`` a part of a sequence; ``ds.document(k)`` document ``k`` (one view:
    a document's sequences are contiguous).
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        parent = Path(self.prefix).parent
        with pair_lock(prefix, exclusive=False) if parent.is_dir() else contextlib.nullcontext():
            self._open(prefix)

    def _open(self, prefix: str | os.PathLike) -> None:
        self.index = read_index(idx_path(prefix))
        data = bin_path(prefix)
        problem = not_a_file(data)
        if problem:
            raise IndexedDatasetError(f"{data} {problem}", "the .bin file must sit beside the .idx file")
        expected = expected_bin_size(self.index)
        actual = data.stat().st_size
        if actual != expected:
            raise IndexedDatasetError(
                f"{data}: {actual} bytes but the index describes {expected} "
                f"({'truncated' if actual < expected else 'trailing bytes'})",
                "the .bin and .idx do not belong together or the copy is incomplete; re-run gptforge prepare",
            )
        # np.memmap refuses empty files; an empty dataset gets an empty buffer.
        self._bin = np.memmap(data, mode="r", dtype=np.uint8) if actual else np.zeros(0, np.uint8)

    @property
    def dtype(self) -> np.dtype:
        return self.index.dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self.index.sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self.index.sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        return self.index.document_indices

    @property
    def num_documents(self) -> int:
        return len(self.index.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.index.sequence_lengths.sum(dtype=np.int64))

    @property
    def buffer(self) -> np.ndarray:
        """All tokens of the ``.bin`` file as one read-only array."""
        return np.frombuffer(self._bin, self.dtype)

    def __len__(self) -> int:
        return len(self.index.sequence_lengths)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        idx = int(idx)
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"sequence {idx} out of range [0, {len(self)})")
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``idx`` (to its end when length is None)."""
        size = int(self.index.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) outside sequence {idx} of length {size}")
        start = int(self.index.sequence_pointers[idx]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, self.dtype, length, start)

    def document(self, doc: int) -> np.ndarray:
        first, last = int(self.document_indices[doc]), int(self.document_indices[doc + 1])
        if first == last:
            return np.zeros(0, self.dtype)
        start = int(self.index.sequence_pointers[first])
        count = int(self.index.sequence_lengths[first:last].sum(dtype=np.int64))
        return np.frombuffer(self._bin, self.dtype, count, start)


def _write_index(f, dtype: np.dtype, lengths: np.ndarray, documents: np.ndarray) -> None:
    lengths = np.asarray(lengths, np.int32)
    pointers = np.zeros(len(lengths), np.int64)
    if len(lengths):
        np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    f.write(MAGIC)
    f.write(struct.pack("<Q", VERSION))
    f.write(struct.pack("<B", CODE_BY_DTYPE[dtype]))
    f.write(struct.pack("<QQ", len(lengths), len(documents)))
    f.write(lengths.tobytes(order="C"))
    f.write(pointers.tobytes(order="C"))
    f.write(np.asarray(documents, np.int64).tobytes(order="C"))


class IndexedDatasetWriter:
    """Writes ``PREFIX.bin/.idx`` under temporary names; ``finalize`` renames them into place.

    Used as a context manager, an exception removes the temporary files, so a failed run leaves
    nothing behind. Each non-empty document is one sequence (Megatron's document level, no
    sentence split); an empty document is a boundary without a sequence, as Megatron writes it.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type, tokenizer: dict | None = None):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        self.tokenizer = tokenizer  # recorded in PREFIX.meta.json when given
        if self.dtype not in CODE_BY_DTYPE:
            raise ValueError(f"dtype {self.dtype} has no MMIDIDX code")
        tag = f".partial-{os.getpid()}"
        self._tmp_bin = Path(f"{bin_path(prefix)}{tag}")
        self._tmp_idx = Path(f"{idx_path(prefix)}{tag}")
        self._tmp_meta = Path(f"{meta_path(prefix)}{tag}")
        try:
            self._bin = open(self._tmp_bin, "wb")
        except OSError as err:
            raise IndexedDatasetError(f"cannot write {self._tmp_bin}: {err.strerror}", "check --output-prefix") from None
        self._lengths: list[np.ndarray] = []
        self._documents: list[np.ndarray] = [np.zeros(1, np.int64)]  # boundary chunks (arrays: 100M documents fit)
        self._document_count = 0
        self._sequences = 0
        self._limits = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None

    def add_document(self, tokens: Sequence[int] | np.ndarray) -> None:
        self.add_documents([tokens])

    def add_documents(self, documents: Iterable[Sequence[int] | np.ndarray]) -> None:
        arrays = [_as_int_array(d) for d in documents]
        if not arrays:
            return
        flat = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        if flat.size and self._limits is not None:
            low, high = int(flat.min()), int(flat.max())
            if low < self._limits.min or high > self._limits.max:
                raise IndexedDatasetError(
                    f"token id {high if high > self._limits.max else low} does not fit dtype {self.dtype}",
                    "use a vocabulary that matches the tokenizer",
                )
        self._bin.write(flat.astype(self.dtype, copy=False).tobytes())
        # An empty document has no sequence, only a boundary (what Megatron's builder writes).
        lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        self._lengths.append(lengths[lengths > 0].astype(np.int32))
        ends = self._sequences + np.cumsum(lengths > 0)
        self._sequences = int(ends[-1])
        self._documents.append(ends.astype(np.int64))
        self._document_count += len(ends)

    def add_index(self, prefix: str | os.PathLike) -> None:
        """Append another dataset (same dtype), keeping its document boundaries."""
        other = IndexedDataset(prefix)
        if other.dtype != self.dtype:
            raise IndexedDatasetError(f"{prefix}: dtype {other.dtype} differs from {self.dtype}", "merge datasets made with the same tokenizer")
        offset = self._sequences
        self._lengths.append(np.array(other.sequence_lengths, np.int32))
        self._documents.append(np.asarray(other.document_indices[1:], np.int64) + offset)
        self._document_count += other.num_documents
        self._sequences += len(other)
        with open(bin_path(prefix), "rb") as src:
            while chunk := src.read(1 << 24):
                self._bin.write(chunk)

    @property
    def num_documents(self) -> int:
        return self._document_count

    def finalize(self) -> None:
        self.seal()
        self.publish()

    def seal(self) -> None:
        """Complete both temporary files; on failure remove them."""
        try:
            self._bin.close()
            lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
            with open(self._tmp_idx, "wb") as f:
                _write_index(f, self.dtype, lengths, np.concatenate(self._documents))
            if self.tokenizer is not None:
                self._tmp_meta.write_text(json.dumps({"tokenizer": self.tokenizer}, indent=2) + "\n")
        except BaseException:
            self.abort()
            raise

    def publish(self) -> None:
        """Rename the sealed files into place as a pair: readers (see ``pair_lock``) see the old pair
        or the new one, and a failed rename puts the old ``.bin`` back, so the old pair stays valid."""
        final_bin, final_idx = bin_path(self.prefix), idx_path(self.prefix)
        backup = Path(f"{final_bin}.old-{os.getpid()}")
        with pair_lock(self.prefix, exclusive=True):
            had_bin = final_bin.is_file()
            if had_bin:
                _keep_copy(final_bin, backup)
            moved = False
            try:
                os.replace(self._tmp_bin, final_bin)
                moved = True
                os.replace(self._tmp_idx, final_idx)
            except OSError as err:
                if moved and had_bin:
                    os.replace(backup, final_bin)
                elif moved:
                    final_bin.unlink(missing_ok=True)
                self.abort()
                raise IndexedDatasetError(f"cannot publish {final_bin.name}/{final_idx.suffix}: "
                                          f"{write_failed(final_idx, err).message}",
                                          f"the previous {final_bin.name} and {final_idx.name} are unchanged") from None
            finally:
                backup.unlink(missing_ok=True)
            if self.tokenizer is not None:
                os.replace(self._tmp_meta, meta_path(self.prefix))
            else:
                meta_path(self.prefix).unlink(missing_ok=True)  # a record of earlier contents would now be wrong

    def abort(self) -> None:
        with contextlib.suppress(OSError):  # a full disk fails the flush of what is buffered: it is discarded anyway
            self._bin.close()
        for tmp in (self._tmp_bin, self._tmp_idx, self._tmp_meta):
            tmp.unlink(missing_ok=True)

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def _keep_copy(path: Path, copy: Path) -> None:
    """A second name for ``path``'s current data (a hard link; a copy where links are not allowed)."""
    copy.unlink(missing_ok=True)
    try:
        os.link(path, copy)
    except OSError:
        shutil.copy2(path, copy)


def _as_int_array(tokens) -> np.ndarray:
    array = np.asarray(tokens)
    return array if array.dtype.kind in "iu" else array.astype(np.int64)  # [] parses as float64


def common_tokenizer(prefixes: Sequence[str | os.PathLike]) -> dict | None:
    """The tokenizer all ``prefixes`` were made with; an error when two records differ.

    None when a dataset has no record (made elsewhere): such datasets cannot be told apart, only
    their dtype is compared.
    """
    records = [(prefix, read_tokenizer_record(prefix)) for prefix in prefixes]
    known = [(prefix, record) for prefix, record in records if record is not None]
    for prefix, record in known[1:]:
        first_prefix, first = known[0]
        if any(record[k] != first[k] for k in TOKENIZER_IDENTITY):
            raise IndexedDatasetError(
                f"{prefix} was made by another tokenizer ({_tokenizer_text(record)}) than {first_prefix} "
                f"({_tokenizer_text(first)})", "merge datasets made with one tokenizer (re-run gptforge prepare with it)")
    return known[0][1] if known and len(known) == len(records) else None


def _tokenizer_text(record: dict) -> str:
    return f"{record.get('kind', '?')}, vocabulary {record.get('vocab_size', '?')}, vocab sha256 {record['vocab_sha256'][:12]}"


def merge_datasets(prefixes: Sequence[str | os.PathLike], output_prefix: str | os.PathLike) -> IndexedDataset:
    """Concatenate several datasets with one dtype into ``output_prefix``."""
    if not prefixes:
        raise IndexedDatasetError("nothing to merge", "give at least one prefix")
    check_output_prefix(output_prefix)
    check_not_an_input([p for prefix in prefixes for p in (bin_path(prefix), idx_path(prefix))],
                       [bin_path(output_prefix), idx_path(output_prefix)])
    dtype = IndexedDataset(prefixes[0]).dtype
    tokenizer = common_tokenizer(prefixes)
    try:
        with output_directory(output_prefix), IndexedDatasetWriter(output_prefix, dtype, tokenizer) as writer:
            for prefix in prefixes:
                writer.add_index(prefix)
    except OSError as err:
        raise write_failed(f"{output_prefix}.bin/.idx", err) from None
    return IndexedDataset(output_prefix)


def check_not_an_input(inputs: Iterable[str | os.PathLike], outputs: Iterable[str | os.PathLike],
                       flag: str = "--output-prefix") -> None:
    """Refuse an output that would overwrite one of the inputs (the same file under any name)."""
    existing = [Path(p) for p in inputs if p and Path(p).exists()]
    for out in outputs:
        out = Path(out)
        for given in existing:
            if out.exists() and os.path.samefile(out, given) or os.path.realpath(out) == os.path.realpath(given):
                raise UsageError(flag, f"{out} would overwrite the input {given}", "choose an output prefix that names no input")
