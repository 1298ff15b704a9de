"""GPT training samples over Megatron indexed datasets, with Megatron-LM's GPTDataset semantics.

For one prefix and one split (a contiguous range of its sequences, from ``--split 949,50,1``):

1. document index: the split's sequence ids repeated for as many epochs as ``num_samples`` needs,
   shuffled with ``numpy.random.RandomState(seed)``; when more than one epoch is needed and the last
   one would supply under 80% of an epoch's samples, that last epoch is shuffled on its own;
2. sample index: ``build_sample_idx`` (documents laid end to end, ``seq_length + 1`` tokens per
   sample, neighbours sharing one token);
3. shuffle index: a permutation of the samples with the same random state (split in two ranges
   when the last epoch is separate).

The three arrays are cached as ``.npy`` under an MD5 of their parameters (and of the ``.idx`` file)
and memory-mapped on the next run. ``len(dataset) == num_samples`` and ``dataset[i]`` equals
Megatron's ``GPTDataset`` text for index ``i`` (an int64 array of ``seq_length + 1`` tokens; inputs
are ``[:-1]``, labels ``[1:]``). A split with no sequences, or asked for 0 samples, is ``None``.
Several prefixes are blended by weight (``BlendedDataset``), as Megatron does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from gptforge.core.dataspec import SPLIT_NAMES, split_weights
from gptforge.data.indexed import IndexedDataset, idx_path
from gptforge.data.sample_index import build_blending_indices, build_sample_idx
from gptforge.errors import UsageError
from gptforge.storage import atomic_path, build_once, write_atomic, write_failed, writing

SEPARATE_EPOCH_THRESHOLD = 0.80
MID_LEVEL_SURPLUS = 0.005  # Megatron's default extra samples per blended component
CACHE_FORMAT = 1


def parse_split(split: str) -> list[tuple[float, float] | None]:
    """``"949,50,1"`` -> bookends ``[(0, .949), (.949, .999), (.999, 1)]``; an empty range is None."""
    parts = split_weights(split)
    total = sum(parts)
    bounds = np.cumsum([0.0] + [p / total for p in parts]).tolist()
    return [(lo, hi) if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]


def split_ranges(num_sequences: int, split: str) -> list[range | None]:
    """Contiguous ranges of sequence ids per split, rounded as Megatron rounds them."""
    out = []
    for bookend in parse_split(split):
        if bookend is None:
            out.append(None)
        else:
            out.append(range(int(round(bookend[0] * num_sequences)), int(round(bookend[1] * num_sequences))))
    return out


def _num_epochs(tokens_per_epoch: int, num_samples: int, seq_length: int) -> int:
    needed = num_samples * seq_length + 1
    return max(1, -(-needed // tokens_per_epoch))


def _document_index(documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_last: bool) -> np.ndarray:
    if not separate_last or num_epochs == 1:
        index = np.tile(documents, num_epochs).astype(np.int32)
        rng.shuffle(index)
        return index
    first = _document_index(documents, num_epochs - 1, rng, False)
    last = _document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def _shuffle_index(num_samples: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_indices(lengths: np.ndarray, documents: np.ndarray, num_samples: int, seq_length: int, seed: int):
    """(document_index, sample_index, shuffle_index) exactly as Megatron's GPTDataset builds them."""
    tokens_per_epoch = int(lengths[documents].sum(dtype=np.int64))
    num_epochs = _num_epochs(tokens_per_epoch, num_samples, seq_length)
    separate_last = False
    if num_epochs > 1:
        sans_last = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate_last = num_samples - sans_last < int(SEPARATE_EPOCH_THRESHOLD * per_epoch)
    total_samples = num_epochs * tokens_per_epoch // seq_length
    # document index (int32), sample index (two int64 per sample) and shuffle index (int64), with shuffle copies
    check_index_memory(2 * num_epochs * len(documents) * 4 + total_samples * (16 + 2 * 8),
                       f"the sample index for {num_samples:,} samples of {seq_length} tokens")
    rng = np.random.RandomState(seed)
    document_index = _document_index(documents, num_epochs, rng, separate_last)
    sample_index = build_sample_idx(lengths, document_index, seq_length, num_epochs, tokens_per_epoch)
    total = sample_index.shape[0] - 1
    shuffle_index = _shuffle_index(sans_last if separate_last else total, total, rng)
    return document_index, sample_index, shuffle_index


def _idx_digest(prefix: str) -> str:
    h = hashlib.sha256()
    with open(idx_path(prefix), "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


class GPTDataset(Sequence):
    """``seq_length + 1`` tokens per sample from one split of one indexed dataset."""

    def __init__(self, dataset: IndexedDataset, split: str, documents: range, num_samples: int,
                 seq_length: int, seed: int, cache_dir: Path, split_string: str):
        self.dataset, self.split, self.seq_length, self.num_samples = dataset, split, seq_length, num_samples
        description = {
            "class": "GPTDataset", "format": CACHE_FORMAT, "dataset_path": dataset.prefix,
            "idx_sha256": _idx_digest(dataset.prefix), "index_split": split, "split": split_string,
            "documents": [documents.start, documents.stop], "num_samples": num_samples,
            "sequence_length": seq_length, "random_seed": seed, "add_extra_token_to_sequence": 1,
        }
        self.description = json.dumps(description, indent=4)
        self.cache_key = hashlib.md5(self.description.encode()).hexdigest()
        self.document_index, self.sample_index, self.shuffle_index = self._load_or_build(
            Path(cache_dir), np.arange(documents.start, documents.stop, dtype=np.int32))
        if self.shuffle_index.shape[0] < num_samples:
            raise RuntimeError(f"built {self.shuffle_index.shape[0]} samples, fewer than {num_samples}")
        # how many times the samples read go over the split's tokens (above 1: samples repeat)
        epochs = len(self.document_index) // max(1, len(documents))
        self.passes = num_samples * epochs / max(1, self.sample_index.shape[0] - 1)

    def _paths(self, cache_dir: Path) -> dict[str, Path]:
        base = f"{self.cache_key}-GPTDataset-{self.split}"
        names = ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy")
        return {n.split(".")[0]: cache_dir / f"{base}-{n}" for n in names}

    def _load_or_build(self, cache_dir: Path, documents: np.ndarray):
        paths = self._paths(cache_dir)
        names = ("document_index", "sample_index", "shuffle_index")

        def cached():
            return self._cached_arrays([paths[n] for n in names]) if paths["description"].is_file() else None

        def build():
            arrays = build_indices(self.dataset.sequence_lengths, documents, self.num_samples, self.seq_length,
                                   json.loads(self.description)["random_seed"])
            for name, array in zip(names, arrays):
                with writing(paths[name]), atomic_path(paths[name]) as tmp:
                    np.save(tmp, array, allow_pickle=False)
            write_atomic(paths["description"], self.description.encode())  # written last: marks a complete entry
            return tuple(np.load(paths[n], mmap_mode="r") for n in names)

        return build_once(cache_dir / f"{self.cache_key}.lock", cached, build,
                          unwritable=lambda err: write_failed(cache_dir, err))

    def _cached_arrays(self, paths: list[Path]):
        """The cached arrays, memory-mapped; None (built again) when one is not a regular file (a FIFO is never
        opened), is damaged, holds Python objects, or points outside the samples and sequences it indexes."""
        try:
            if not all(path.is_file() for path in paths):
                return None
            document_index, sample_index, shuffle_index = (np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
        except (OSError, ValueError, EOFError):
            return None
        arrays = (document_index, sample_index, shuffle_index)
        if not (all(a.dtype.kind in "iu" and a.size for a in arrays) and document_index.ndim == 1
                and sample_index.ndim == 2 and sample_index.shape[1] == 2 and shuffle_index.ndim == 1
                and len(shuffle_index) >= self.num_samples):
            return None
        lengths = self.dataset.sequence_lengths
        in_range = (0 <= shuffle_index.min() and shuffle_index.max() < len(sample_index) - 1
                    and 0 <= sample_index.min() and sample_index[:, 0].max() < len(document_index)
                    and 0 <= document_index.min() and document_index.max() < len(lengths))
        if not in_range:
            return None
        # each sample starts inside its document and ends seq_length tokens after the one before it
        epoch_lengths = lengths[document_index].astype(np.int64)
        docs, offsets = sample_index[:, 0], sample_index[:, 1].astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(epoch_lengths)))[docs] + offsets
        fits = bool((offsets < epoch_lengths[docs]).all() and (np.diff(starts) == self.seq_length).all())
        return arrays if fits else None

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> np.ndarray:
        if not -self.num_samples <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range [0, {self.num_samples})")
        j = int(self.shuffle_index[i % self.num_samples])
        (first, first_offset), (last, last_offset) = self.sample_index[j], self.sample_index[j + 1]
        first, first_offset, last, last_offset = int(first), int(first_offset), int(last), int(last_offset)
        get = self.dataset.get
        if first == last:
            text = get(int(self.document_index[first]), first_offset, last_offset - first_offset + 1)
            return text.astype(np.int64)
        parts = [get(int(self.document_index[first]), first_offset)]
        parts += [get(int(self.document_index[k])) for k in range(first + 1, last)]
        parts.append(get(int(self.document_index[last]), 0, last_offset + 1))
        return np.concatenate(parts).astype(np.int64)


class BlendedDataset(Sequence):
    """Samples drawn from several datasets in proportion to their weights (Megatron's greedy blend)."""

    def __init__(self, datasets: list[GPTDataset], weights: list[float], size: int):
        self.datasets, self.weights, self.size = datasets, weights, size
        self.passes = max(ds.passes for ds in datasets)  # the most-repeated dataset's
        check_index_memory(size * (2 + 8), f"the blending index for {size:,} samples")  # int16 + int64 per sample
        self.dataset_index, self.dataset_sample_index = build_blending_indices(np.asarray(weights), size)
        for d, ds in enumerate(datasets):
            drawn = self.dataset_sample_index[self.dataset_index == d]
            if len(drawn) and int(drawn.max()) >= len(ds):
                raise RuntimeError(f"blend draws {int(drawn.max()) + 1} samples from a dataset of {len(ds)}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> np.ndarray:
        if not -self.size <= i < self.size:
            raise IndexError(f"sample {i} out of range [0, {self.size})")
        return self.datasets[int(self.dataset_index[i])][int(self.dataset_sample_index[i])]


def _as_prefixes(prefixes) -> list[str]:
    if isinstance(prefixes, (str, os.PathLike)):
        return [os.fspath(prefixes)]
    return [os.fspath(p) for p in prefixes]


def _default_cache_dir(prefix: str) -> Path:
    return Path(prefix).parent / "cache" / "GPTDataset_indices"


def build_gpt_datasets(
    prefixes,
    weights: Sequence[float] | None = None,
    *,
    split: str = "949,50,1",
    seq_length: int,
    num_samples: tuple[int, int, int],
    seed: int = 1234,
    cache_dir: str | os.PathLike | None = None,
) -> tuple:
    """(train, valid, test): GPTDataset (one prefix) or BlendedDataset (several), or None per split.

    ``prefixes``: one prefix or a list; ``weights``: one per prefix (normalised), or None to weigh
    prefixes by their token counts. ``num_samples``: samples wanted per split; epochs are repeated
    as needed. A split with no sequences or 0 samples requested is None.
    """
    paths = _as_prefixes(prefixes)
    if not paths:
        raise UsageError("--data-path", "no dataset prefix given", "pass at least one prefix")
    if seq_length < 1:
        raise UsageError("--seq-length", f"{seq_length} is not a sequence length", "use a positive length")
    if len(num_samples) != 3 or any(n < 0 for n in num_samples):
        raise UsageError(None, f"num_samples {num_samples!r} must be three counts >= 0")
    if weights is not None and len(weights) != len(paths):
        raise UsageError("--data-path", f"{len(weights)} weights for {len(paths)} prefixes", "give one weight per prefix")
    datasets = [IndexedDataset(p) for p in paths]
    for dataset in datasets:
        check_token_dataset(dataset)
    if weights is None:
        weights = [float(d.num_tokens) for d in datasets]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UsageError("--data-path", f"weights {list(weights)} must be >= 0 and not all 0",
                         "give each prefix a weight >= 0, e.g. data-path='0.7 a_text 0.3 b_text'")
    normalised = [w / sum(weights) for w in weights]
    splits = [split_ranges(len(d), split) for d in datasets]
    out = []
    for s, name in enumerate(SPLIT_NAMES):
        wanted = num_samples[s]
        if len(datasets) == 1:
            out.append(_one(datasets[0], splits[0][s], name, wanted, seq_length, seed, cache_dir, split))
            continue
        parts, part_weights = [], []
        for d, ds in enumerate(datasets):
            size = int(math.ceil(math.ceil(wanted * normalised[d]) * (1 + MID_LEVEL_SURPLUS)))
            part = _one(ds, splits[d][s], name, size, seq_length, seed, cache_dir, split) if normalised[d] > 0 else None
            if part is not None:
                parts.append(part)
                part_weights.append(normalised[d])
        total = sum(part_weights)
        out.append(BlendedDataset(parts, [w / total for w in part_weights], wanted) if parts and wanted else None)
    return tuple(out)


def check_token_dataset(dataset: IndexedDataset) -> None:
    """Token ids are integers, and a dataset to train on holds some."""
    fix = "re-create it with gptforge prepare"
    if dataset.dtype.kind not in "iu":
        raise UsageError("--data-path", f"{dataset.prefix} holds {dataset.dtype} values, not integer token ids", fix)
    if dataset.num_tokens == 0:
        raise UsageError("--data-path", f"{dataset.prefix} holds no tokens ({dataset.num_documents} documents, all empty)",
                         "prepare it from a corpus with text, or leave it out of data-path")


def check_index_memory(num_bytes: int, what: str) -> None:
    """Refuse an index that cannot fit in this machine's memory before allocating it."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if num_bytes > physical:
        raise UsageError("train-iters", f"{what} needs {num_bytes / 2**30:,.1f} GiB, more than this machine's "
                         f"{physical / 2**30:,.1f} GiB of memory", "train fewer samples (train-iters x global-batch-size)")


def _one(dataset, documents, name, num_samples, seq_length, seed, cache_dir, split):
    if documents is None or len(documents) == 0 or num_samples == 0:
        return None
    if int(dataset.sequence_lengths[documents.start:documents.stop].sum(dtype=np.int64)) < 2:
        return None
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir(dataset.prefix)
    return GPTDataset(dataset, name, documents, num_samples, seq_length, seed, cache, split)
