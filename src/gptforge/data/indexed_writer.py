"""Writing Megatron's indexed dataset (the layout is in data/indexed.py): the writer, which publishes the
``.bin``/``.idx`` pair only when both are complete, and merging several datasets into one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from gptforge.data.indexed import (CODE_BY_DTYPE, MAGIC, TOKENIZER_IDENTITY, VERSION, IndexedDataset,
                                   IndexedDatasetError, bin_path, check_not_an_input, check_output_prefix, idx_path,
                                   meta_path, output_directory, pair_lock, read_tokenizer_record)
from gptforge.storage import write_failed


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
