"""What ``gptforge data inspect`` reports about a ``.bin/.idx`` pair (after validating it)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass

import numpy as np

from gptforge.data.indexed import CODE_BY_DTYPE, IndexedDataset, as_prefix, bin_path, idx_path

CHUNK_TOKENS = 1 << 24


@dataclass(frozen=True)
class Summary:
    prefix: str
    documents: int
    empty_documents: int
    sequences: int
    tokens: int
    dtype: str
    dtype_code: int
    min_token: int | None
    max_token: int | None
    min_sequence_length: int | None
    max_sequence_length: int | None
    mean_sequence_length: float | None
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str  # content checksum of the token data

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(prefix: str | os.PathLike) -> Summary:
    """Open (which validates magic, version, dtype, counts, pointers and the .bin size) and summarise.

    ``prefix`` may also name the ``.bin`` or ``.idx`` file."""
    prefix = as_prefix(prefix)
    ds = IndexedDataset(prefix)
    tokens = ds.buffer
    digest = hashlib.sha256()
    low = high = None
    for start in range(0, len(tokens), CHUNK_TOKENS):
        chunk = tokens[start : start + CHUNK_TOKENS]
        digest.update(chunk.tobytes())
        lo, hi = int(chunk.min()), int(chunk.max())
        low, high = (lo, hi) if low is None else (min(low, lo), max(high, hi))
    lengths = ds.sequence_lengths
    docs = np.diff(ds.document_indices)
    return Summary(
        prefix=os.fspath(prefix),
        documents=ds.num_documents,
        empty_documents=int(np.count_nonzero(docs == 0)),
        sequences=len(ds),
        tokens=ds.num_tokens,
        dtype=str(ds.dtype),
        dtype_code=CODE_BY_DTYPE[ds.dtype],
        min_token=low,
        max_token=high,
        min_sequence_length=int(lengths.min()) if len(lengths) else None,
        max_sequence_length=int(lengths.max()) if len(lengths) else None,
        mean_sequence_length=round(float(lengths.mean()), 2) if len(lengths) else None,
        bin_bytes=bin_path(prefix).stat().st_size,
        idx_bytes=idx_path(prefix).stat().st_size,
        bin_sha256=digest.hexdigest(),
    )
