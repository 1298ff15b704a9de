"""Datasets for the trainer: the embedded default corpus or Megatron .bin/.idx prefixes, and batches.

The batch of a step is a pure function of the data position (samples consumed so far), the rank and
the micro-step, so a resumed run reads exactly the samples the uninterrupted run would have read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptforge.core.findings import Finding, Severity
from gptforge.errors import GptforgeError, UsageError
from gptforge.paths import not_a_file
from gptforge.storage import publish_dir
from gptforge.train.config import TrainConfig

DEFAULT_TOKENIZER = "bytelevel"  # the kind name gptforge.data gives the embedded corpus' BPE


@dataclass
class TokenizerSpec:
    kind: str
    tokenizer_dir: str = ""
    vocab_file: str = ""
    merge_file: str = ""

    def load(self, base: Path | None = None):
        from gptforge.data.tokenizer import load_tokenizer

        def where(p: str):
            return None if not p else str((base / p) if base and not Path(p).is_absolute() else p)

        return load_tokenizer(self.kind, tokenizer_dir=where(self.tokenizer_dir),
                              vocab_file=where(self.vocab_file), merge_file=where(self.merge_file))

    def copy_into(self, run_dir: Path) -> "TokenizerSpec":
        """The same tokenizer with its files copied under RUN/tokenizer (a run is self-contained). The copy
        is staged and renamed into place: a killed copy never leaves a RUN/tokenizer missing files."""
        for stale in run_dir.glob(".tokenizer.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staged = run_dir / f".tokenizer.tmp-{os.getpid()}"
        staged.mkdir(parents=True)
        copied = TokenizerSpec(self.kind)
        if self.tokenizer_dir:
            shutil.copytree(self.tokenizer_dir, staged, dirs_exist_ok=True)
            copied.tokenizer_dir = "tokenizer"
        for attr in ("vocab_file", "merge_file"):
            src = getattr(self, attr)
            if src:
                shutil.copy2(src, staged / Path(src).name)
                setattr(copied, attr, f"tokenizer/{Path(src).name}")
        publish_dir(staged, run_dir / "tokenizer")
        return copied


@dataclass
class DataSetup:
    train: object
    valid: object
    tokenizer: TokenizerSpec
    vocab_size: int
    description: str


def prefixes_and_weights(cfg: TrainConfig) -> tuple[list[str], list[float] | None]:
    if len(cfg.data_path) <= 1:
        return list(cfg.data_path), None
    weights = [float(w) for w in cfg.data_path[0::2]]
    return list(cfg.data_path[1::2]), weights


def check_data_paths(cfg: TrainConfig) -> None:
    """Missing prefixes and tokenizer files are usage errors, found before any GPU work."""
    prefixes, _ = prefixes_and_weights(cfg)
    for prefix in prefixes:
        problems = [f"{prefix + ext} {problem}" for ext in (".bin", ".idx") if (problem := not_a_file(prefix + ext))]
        if problems:
            raise UsageError("data-path", " and ".join(problems),
                             "give the prefix of a 'gptforge prepare' output (PATH without .bin/.idx), "
                             "or leave data-path empty to use the embedded corpus")
    if prefixes and cfg.tokenizer_type == "default":
        raise UsageError("tokenizer-type", "data-path is set but not the tokenizer it was made with",
                         "set tokenizer-type and tokenizer-dir (or vocab-file and merge-file)")
    for attr in ("tokenizer_dir", "vocab_file", "merge_file"):
        value = getattr(cfg, attr)
        if value and not Path(value).exists():
            raise UsageError(attr.replace("_", "-"), f"{value} not found", "give an existing path")


def data_cache_dir(cfg: TrainConfig) -> Path:
    """data-cache-dir, created and shown writable: a directory is made (and removed again) in it. Permission
    bits are not enough: root passes them on /proc and read-only mounts."""
    path = Path(cfg.data_cache_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".gptforge-write-test-", dir=path))
    except OSError as err:
        reason = "not a directory" if isinstance(err, (FileExistsError, NotADirectoryError)) else err.strerror or err
        raise UsageError("data-cache-dir", f"cannot write in {path}: {reason}",
                         "give a directory you can write to") from None
    return path


def prepare_default_corpus(cfg: TrainConfig):
    from gptforge.data.default_corpus import prepare_default

    return prepare_default(data_cache_dir(cfg) / f"default-{cfg.default_vocab_size}", vocab_size=cfg.default_vocab_size)


def sample_counts(cfg: TrainConfig) -> tuple[int, int, int]:
    return cfg.train_iters * cfg.global_batch_size, cfg.eval_iters * cfg.global_batch_size, 1


def tokenizer_for(cfg: TrainConfig, default_paths=None) -> tuple[TokenizerSpec, int]:
    """The run's tokenizer and its vocabulary size (cheap: no dataset index is built)."""
    if cfg.data_path:
        spec = TokenizerSpec(cfg.tokenizer_type, cfg.tokenizer_dir, cfg.vocab_file, cfg.merge_file)
    else:
        spec = TokenizerSpec(DEFAULT_TOKENIZER, tokenizer_dir=str(default_paths.tokenizer_dir))
    return spec, spec.load().vocab_size


def build(cfg: TrainConfig, default_paths, spec: TokenizerSpec, vocab_size: int) -> DataSetup:
    from gptforge.data.gpt_dataset import build_gpt_datasets

    if cfg.data_path:
        prefixes, weights = prefixes_and_weights(cfg)
        description = f"data: {' '.join(cfg.data_path)}"
    else:
        prefixes, weights = [str(default_paths.prefix)], None
        description = f"data: embedded default corpus ({default_paths.prefix})"
    train, valid, _ = build_gpt_datasets(
        prefixes, weights, split=cfg.split, seq_length=cfg.seq_length, num_samples=sample_counts(cfg),
        seed=cfg.seed, cache_dir=str(data_cache_dir(cfg) / "index-cache"),
    )
    if valid is None or len(valid) == 0:
        raise UsageError("split", f"{cfg.split!r} leaves no validation documents", "give the second weight a share, e.g. 949,50,1")
    return DataSetup(train, valid, spec, vocab_size, description)


def load(cfg: TrainConfig, env, status, check_vocab) -> DataSetup:
    """The run's data: the embedded corpus prepared by each node's local rank 0 first (under STATUS, a
    console's spinner), then read from its cache by the others, or the user's prefixes; CHECK_VOCAB(vocab size)
    runs before the dataset indices are built."""
    from gptforge.train import distributed

    default_paths = None
    if not cfg.data_path:
        if env.local_rank == 0:
            with status("preparing the embedded default corpus (cached after the first run)"):
                default_paths = prepare_default_corpus(cfg)
        distributed.barrier(env)
        if env.local_rank != 0:
            default_paths = prepare_default_corpus(cfg)
    spec, vocab_size = tokenizer_for(cfg, default_paths)
    check_vocab(vocab_size)
    return build(cfg, default_paths, spec, vocab_size)


def repeat_note(train) -> Finding | None:
    """A note when the run reads its training split more than once: past the first pass its training loss
    is measured on samples the model has already fitted, so only the validation loss is held out."""
    passes = getattr(train, "passes", 1.0)
    if passes <= 1.0:
        return None
    return Finding("data-repeats", Severity.INFO, f"data: the run reads the training split {passes:.1f} times; past "
                   "the first pass the training loss is not a held-out loss (the validation loss is)")


def batch(dataset, start: int, count: int, device: torch.device, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples [start, start+count) as (inputs, labels) on ``device``."""
    n = len(dataset)
    rows = np.stack([np.asarray(dataset[(start + i) % n], dtype=np.int64) for i in range(count)])
    check_token_ids(rows, vocab_size, start)
    tokens = torch.from_numpy(rows)
    if device.type == "cuda":
        tokens = tokens.pin_memory().to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def check_token_ids(rows: np.ndarray, vocab_size: int, start: int) -> None:
    """Every token id indexes the embedding table (checked per batch: a scan of the whole dataset at start
    would cost minutes on a large one)."""
    low, high = int(rows.min()), int(rows.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise GptforgeError(f"token id {bad} in samples {start}..{start + len(rows) - 1} is outside the tokenizer's "
                            f"vocabulary [0, {vocab_size})", "train with the tokenizer the data was prepared with "
                            "(tokenizer-type, tokenizer-dir), or re-create the data with gptforge prepare")


class BatchReader:
    """Batches of one dataset, with one read ahead: the trainer asks for the next step's first batch
    while the GPU still runs the current step, so the host work does not leave the GPU idle."""

    def __init__(self, dataset, count: int, device: torch.device, vocab_size: int):
        self.dataset, self.count, self.device, self.vocab_size = dataset, count, device, vocab_size
        self.ahead: tuple[int, tuple] | None = None

    def get(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ahead is not None and self.ahead[0] == start:
            found, self.ahead = self.ahead[1], None
            return found
        return batch(self.dataset, start, self.count, self.device, self.vocab_size)

    def prefetch(self, start: int) -> None:
        self.ahead = (start, batch(self.dataset, start, self.count, self.device, self.vocab_size))


def micro_batch_start(consumed: int, micro: int, rank: int, world: int, micro_batch_size: int) -> int:
    """First sample of micro-step ``micro`` on ``rank``: a global batch is laid out micro-major."""
    return consumed + (micro * world + rank) * micro_batch_size
