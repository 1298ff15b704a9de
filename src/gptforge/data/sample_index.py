"""GPT sample index and blending indices: NumPy reference, and the compiled helpers when built.

``build_sample_idx`` and ``build_blending_indices`` have Megatron-LM's semantics (its
``megatron/core/datasets/helpers.cpp``). The C++ module compiled by ``gptforge build helpers``
(``gptforge/data/helpers.cpp``) computes the same arrays faster; the NumPy functions here are the
reference a property test holds it to, and what runs when it has not been built.
"""

from __future__ import annotations

import sys

import numpy as np

_NOTICE_SHOWN = False


def reference_build_sample_idx(sizes: np.ndarray, document_idx: np.ndarray, seq_length: int, num_epochs: int,
                               tokens_per_epoch: int, drop_last_partial_sequence: bool = True,
                               add_extra_token_to_sequence: int = 1, dtype=np.int32) -> np.ndarray:
    """Rows ``(i, offset)``: sample ``j`` spans from row ``j`` to row ``j + 1`` of the documents
    ``document_idx`` laid end to end; row ``i`` indexes ``document_idx``, ``offset`` counts tokens.

    Sample ``j`` starts at global token ``j * seq_length`` and holds ``seq_length + extra`` tokens,
    so neighbours share ``extra`` tokens. A boundary row names the document holding the sample's
    last token, with ``offset = end - document_start - extra`` (so it may equal the document's
    length when ``extra`` is 0), exactly as Megatron's loop records it.
    """
    extra = int(add_extra_token_to_sequence)
    total = int(num_epochs) * int(tokens_per_epoch)
    if drop_last_partial_sequence:
        num_samples = (total - extra) // seq_length
    else:  # Megatron computes this ceil in single precision; so do we, to agree on every input
        num_samples = int(np.ceil(np.float32(total - extra) / np.float32(seq_length)))
    if num_samples < 0:
        raise ValueError("fewer tokens than one sample")
    lengths = np.asarray(sizes)[np.asarray(document_idx)].astype(np.int64)
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    ends = np.arange(1, num_samples + 1, dtype=np.int64) * seq_length + extra
    rows = np.empty((num_samples + 1, 2), dtype)
    rows[0] = 0
    beyond = ends > starts[-1]
    if np.any(beyond[:-1]) or (len(beyond) and beyond[-1] and drop_last_partial_sequence):
        raise ValueError(f"the documents hold {starts[-1]} tokens, fewer than {num_epochs} x {tokens_per_epoch} requires")
    doc = np.searchsorted(starts, ends - 1, side="right") - 1
    rows[1:, 0] = doc
    rows[1:, 1] = ends - starts[np.minimum(doc, len(lengths) - 1)] - extra
    if len(beyond) and beyond[-1]:  # the partial last sample ends at the last document's end
        rows[-1] = (len(lengths) - 1, lengths[-1] - extra)
    return rows


def reference_build_blending_indices(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy blend: sample ``i`` comes from the dataset furthest below its share ``weights[d] * i``.

    Returns ``(dataset_index int16[size], dataset_sample_index int64[size])``. Plain Python floats
    are IEEE doubles, so the arithmetic (and every tie, broken towards the lower index) matches C++.
    """
    w = [float(x) for x in np.asarray(weights, np.float64)]
    counts = [0] * len(w)
    dataset_index = np.empty(size, np.int16)
    sample_index = np.empty(size, np.int64)
    for i in range(size):
        x = max(float(i), 1.0)
        best, best_error = 0, w[0] * x - counts[0]
        for d in range(1, len(w)):
            error = w[d] * x - counts[d]
            if error > best_error:
                best, best_error = d, error
        dataset_index[i] = best
        sample_index[i] = counts[best]
        counts[best] += 1
    return dataset_index, sample_index


def compiled_helpers(*, notice: bool = True):
    """The compiled module if ``gptforge build helpers`` has built it for this interpreter, else None."""
    global _NOTICE_SHOWN
    from gptforge.build.helpers import load_helpers

    module = load_helpers()
    if module is None and notice and not _NOTICE_SHOWN:
        _NOTICE_SHOWN = True
        print("gptforge: dataset helpers not compiled, using the NumPy implementation (run: gptforge build helpers)", file=sys.stderr)
    return module


def sample_index_dtype(sizes: np.ndarray, document_idx: np.ndarray):
    """int32 unless a document index or size exceeds it (Megatron's rule)."""
    largest = max(len(document_idx), int(np.max(sizes)) if len(sizes) else 0)
    return np.int32 if largest <= np.iinfo(np.int32).max else np.int64


def build_sample_idx(
    sizes: np.ndarray,
    document_idx: np.ndarray,
    seq_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: int = 1,
    *,
    use_compiled: bool | None = None,
) -> np.ndarray:
    """The sample index, from the compiled helpers when available (``use_compiled`` forces a side)."""
    sizes = np.ascontiguousarray(sizes, np.int32)
    document_idx = np.ascontiguousarray(document_idx, np.int32)
    dtype = sample_index_dtype(sizes, document_idx)
    module = compiled_helpers(notice=use_compiled is None) if use_compiled is not False else None
    if use_compiled and module is None:
        raise RuntimeError("the compiled helpers are not built (gptforge build helpers)")
    args = (sizes, document_idx, int(seq_length), int(num_epochs), int(tokens_per_epoch),
            bool(drop_last_partial_sequence), int(add_extra_token_to_sequence))
    if module is not None:
        fn = module.build_sample_idx_int32 if dtype == np.int32 else module.build_sample_idx_int64
        return fn(*args)
    return reference_build_sample_idx(*args, dtype=dtype)


def build_blending_indices(weights, size: int, *, use_compiled: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    weights = np.ascontiguousarray(weights, np.float64)
    module = compiled_helpers(notice=use_compiled is None) if use_compiled is not False else None
    if use_compiled and module is None:
        raise RuntimeError("the compiled helpers are not built (gptforge build helpers)")
    if module is None:
        return reference_build_blending_indices(weights, size)
    dataset_index = np.zeros(size, np.int16)
    sample_index = np.zeros(size, np.int64)
    module.build_blending_indices(dataset_index, sample_index, weights, len(weights), size, False)
    return dataset_index, sample_index
