"""Corpus -> tokenizer -> Megatron ``.bin/.idx``: what ``gptforge prepare`` runs.

Documents are read in order, tokenized in chunks (in this process, or by ``workers`` processes),
and written in input order, so the output does not depend on the worker count. Outputs are written
under temporary names (``*.partial-PID``) and renamed only when every document is in; an error,
Ctrl-C or SIGTERM removes them, and a later run removes those a killed process left behind.

Files the user names as input (the corpus, --tokenizer-dir, --vocab-file, --merge-file) are only
read: a tokenizer trained here is saved beside the output (``<output-prefix>_tokenizer``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import os
import shutil
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from gptforge.data.indexed import (bin_path, check_not_an_input, check_output_prefix, idx_path, optimal_dtype,
                                   output_directory)
from gptforge.data.indexed_writer import IndexedDatasetWriter
from gptforge.data.readers import CorpusError, Record, SkipLog, read_corpus
from gptforge.data.tokenizer import (PIECE_CHARS, VOCAB_NAME, Tokenizer, check_vocab_size, load_tokenizer, pieces,
                                     publish_trained, train_bytelevel)
from gptforge.errors import GptforgeError, UsageError
from gptforge.storage import write_failed

PARTIAL = ".partial-"  # a name being written by process PID: NAME.partial-PID


class Terminated(GptforgeError):
    """SIGTERM arrived: the outputs were removed."""

    exit_code = 128 + signal.SIGTERM

CHUNK_RECORDS = 256


@dataclass
class PrepareResult:
    prefixes: dict[str, Path]  # json key -> output prefix (``P_<key>_document``)
    tokenizer_dir: Path | None
    tokenizer: Tokenizer
    trained_tokenizer: bool = False  # this run trained (and saved) the tokenizer
    documents: int = 0
    tokens: int = 0
    seconds: float = 0.0
    skipped: SkipLog = field(default_factory=SkipLog)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def output_prefix_for(output_prefix: str | os.PathLike, key: str) -> Path:
    """Megatron's naming: ``--output-prefix P`` and key ``text`` give ``P_text_document``."""
    return Path(f"{os.fspath(output_prefix)}_{key}_document")


def default_tokenizer_dir(output_prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(output_prefix)}_tokenizer")


def resolve_tokenizer(
    kind: str,
    corpus: Iterable[str],
    *,
    output_prefix,
    tokenizer_dir=None,
    vocab_file=None,
    merge_file=None,
    vocab_size: int | None = None,
    trained_dir=None,
) -> tuple[Tokenizer, Path | None, Path | None]:
    """(tokenizer, its directory, the staging directory of one trained here or None).

    ``tokenizer_dir`` is the user's: only read. A ``bytelevel`` tokenizer without one is loaded from
    ``trained_dir`` (default ``<output-prefix>_tokenizer``) or trained on ``corpus`` into a staging
    directory beside it, which ``publish_trained`` renames into place once the data is written."""
    if kind == "bytelevel" and vocab_file is None and tokenizer_dir is None:
        directory = Path(trained_dir) if trained_dir else default_tokenizer_dir(output_prefix)
        if (directory / VOCAB_NAME).is_file():
            return load_tokenizer(kind, tokenizer_dir=directory), directory, None
        staging = Path(f"{directory}{PARTIAL}{os.getpid()}")
        return train_bytelevel(corpus, staging, vocab_size=vocab_size or 8192), directory, staging
    if tokenizer_dir is not None and not (Path(tokenizer_dir) / VOCAB_NAME).is_file():
        raise UsageError("--tokenizer-dir", f"{tokenizer_dir} has no {VOCAB_NAME}; prepare reads that directory, never writes it",
                         f"give a directory holding vocab.json and merges.txt, or drop --tokenizer-dir to train a "
                         f"bytelevel tokenizer into {default_tokenizer_dir(output_prefix)}")
    if vocab_size is not None and kind == "bytelevel":
        raise UsageError("--vocab-size", "a tokenizer is only trained without --tokenizer-dir/--vocab-file",
                         "drop --vocab-size, or drop --tokenizer-dir to train one")
    if vocab_size is not None:
        raise UsageError("--vocab-size", "only a bytelevel tokenizer is trained", "drop --vocab-size or use --tokenizer bytelevel")
    tok = load_tokenizer(kind, tokenizer_dir=tokenizer_dir, vocab_file=vocab_file, merge_file=merge_file)
    return tok, Path(tokenizer_dir) if tokenizer_dir else None, None


# --- tokenization (runs in worker processes too) ---------------------------------------------

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer, in_pool: bool = True) -> None:
    global _worker_tokenizer
    if in_pool:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one worker process = one core
    _worker_tokenizer = tokenizer


def _encode_chunk(args: tuple[list[tuple[str, ...]], bool]) -> list[list[np.ndarray]]:
    """Token arrays of a chunk of records, one list per key (EOD appended to non-empty documents)."""
    chunk, append_eod = args
    tok = _worker_tokenizer
    dtype = optimal_dtype(tok.vocab_size)
    per_key = []
    for column in zip(*chunk):
        long = {i for i, text in enumerate(column) if len(text) > PIECE_CHARS}
        short = iter(tok.encode_batch([text for i, text in enumerate(column) if i not in long]))
        arrays = []
        for i, text in enumerate(column):
            ids = tok.encode_array(text, dtype) if i in long else np.asarray(next(short), dtype=dtype)
            if len(ids) and append_eod:
                ids = np.append(ids, np.asarray(tok.eod_id, dtype=dtype))
            arrays.append(ids)
        per_key.append(arrays)
    return per_key


def _chunks(records: Iterator[Record], size: int) -> Iterator[list[tuple[str, ...]]]:
    while chunk := [r.texts for r in itertools.islice(records, size)]:
        yield chunk


def _encoded(records: Iterator[Record], tokenizer: Tokenizer, append_eod: bool, workers: int) -> Iterator[list[list[np.ndarray]]]:
    jobs = ((chunk, append_eod) for chunk in _chunks(records, CHUNK_RECORDS))
    if workers <= 1:
        _init_worker(tokenizer, in_pool=False)
        yield from map(_encode_chunk, jobs)
        return
    # spawn: safe with the tokenizer libraries' thread pools, same behaviour on every platform
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer,)) as pool:
        pending: collections.deque = collections.deque()
        try:
            for job in jobs:  # in order, with at most 2 chunks per worker read ahead
                pending.append(_submit(pool, job))
                if len(pending) > 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def _submit(pool: ProcessPoolExecutor, job) -> Future:
    """Submit with SIGINT blocked: the workers that submit starts inherit the block for good.

    Ctrl-C reaches the whole process group. Only the parent acts on it: it cancels the queued
    chunks, lets the workers finish theirs and exit, and removes the outputs; a worker that took
    the signal itself would print a traceback, or die in the middle of sending a result.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(_encode_chunk, job)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.completed:,} documents"),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def prepare(
    inputs: Sequence[str | os.PathLike],
    output_prefix: str | os.PathLike,
    *,
    tokenizer: str = "gpt2",
    fmt: str | None = None,
    json_keys: Sequence[str] = ("text",),
    vocab_file=None,
    merge_file=None,
    tokenizer_dir=None,
    trained_tokenizer_dir=None,
    vocab_size: int | None = None,
    append_eod: bool = False,
    workers: int = 1,
    skip_bad_lines: bool = False,
    progress: bool = True,
) -> PrepareResult:
    """Tokenize ``inputs`` into ``<output_prefix>_<key>_document.bin/.idx`` for every json key."""
    _check_arguments(inputs, output_prefix, workers, json_keys, vocab_size)
    check_not_an_input([*inputs, vocab_file, merge_file, tokenizer_dir],
                       [p for key in json_keys for p in _pair(output_prefix_for(output_prefix, key))]
                       + [trained_tokenizer_dir or default_tokenizer_dir(output_prefix)])
    remove_dead_leftovers(output_prefix, trained_tokenizer_dir)

    def read(skipped: SkipLog) -> Iterator[Record]:
        return read_corpus(inputs, fmt=fmt, json_keys=json_keys, skip_bad_lines=skip_bad_lines, skipped=skipped)

    _require_text(read, inputs)
    writers: list[IndexedDatasetWriter] = []
    staging = Path(f"{trained_tokenizer_dir or default_tokenizer_dir(output_prefix)}{PARTIAL}{os.getpid()}")
    with _terminate_as_exception(), output_directory(output_prefix):  # created now; removed if this run fails
        try:
            training_text = (piece for record in read(SkipLog()) for text in record.texts for piece in pieces(text))
            tok, tok_dir, staging = resolve_tokenizer(
                tokenizer, training_text, output_prefix=output_prefix, tokenizer_dir=tokenizer_dir,
                vocab_file=vocab_file, merge_file=merge_file, vocab_size=vocab_size, trained_dir=trained_tokenizer_dir,
            )
            result = PrepareResult({key: output_prefix_for(output_prefix, key) for key in json_keys}, tok_dir, tok,
                                   staging is not None)
            start = time.perf_counter()
            for key in json_keys:
                writers.append(IndexedDatasetWriter(result.prefixes[key], optimal_dtype(tok.vocab_size), tok.record()))
            _write_all(_encoded(read(result.skipped), tok, append_eod, workers), writers, result, progress, start)
            for writer in writers:
                writer.seal()
            for writer in writers:
                writer.publish()
            if staging is not None:
                result.tokenizer = publish_trained(staging, tok_dir)
        except BaseException as err:
            _discard(writers, staging)
            if isinstance(err, OSError):
                raise write_failed(err.filename or output_prefix, err) from None
            raise
    result.seconds = time.perf_counter() - start
    return result


def _pair(prefix) -> tuple[Path, Path]:
    return bin_path(prefix), idx_path(prefix)


def _discard(writers: list[IndexedDatasetWriter], staging: Path | None) -> None:
    """A failed or interrupted run leaves nothing: no temporary files, no tokenizer it trained."""
    for writer in writers:
        writer.abort()
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _terminate_as_exception():
    """SIGTERM (kill, a scheduler's time limit) unwinds like Ctrl-C, so the outputs are removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated("terminated (SIGTERM); the partial outputs were removed", "rerun prepare")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_leftovers(output_prefix, trained_dir=None) -> list[Path]:
    """Remove ``<output-prefix>_*.partial-PID`` files and tokenizer staging directories whose
    process is gone (SIGKILL, OOM, power loss); those of a live process are left alone."""
    prefix = Path(os.fspath(output_prefix))
    found = list(prefix.parent.glob(f"{prefix.name}_*{PARTIAL}*"))
    if trained_dir is not None:
        found += Path(trained_dir).parent.glob(f"{Path(trained_dir).name}{PARTIAL}*")
    removed = []
    for path in found:
        pid = path.name.rpartition(PARTIAL)[2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _check_arguments(inputs, output_prefix, workers: int, json_keys, vocab_size: int | None) -> None:
    if vocab_size is not None:
        check_vocab_size(vocab_size)
    if not inputs:
        raise UsageError("--input", "no input files", "give at least one --input")
    check_output_prefix(output_prefix)
    if workers < 1:
        raise UsageError("--workers", f"{workers} is not a worker count", "use 1 or more")
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise UsageError("--json-keys", "keys must be given once each", "e.g. --json-keys text")


def _write_all(encoded, writers, result: PrepareResult, progress: bool, start: float) -> None:
    """Append every encoded chunk to the writers (one per key), counting and showing progress."""
    with _progress(progress) as bar:
        task = bar.add_task("tokenizing", tokens=0, rate="")
        for per_key in encoded:
            for writer, arrays in zip(writers, per_key):
                writer.add_documents(arrays)
                result.tokens += sum(len(a) for a in arrays)
            result.documents += len(per_key[0])
            rate = result.tokens / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=result.documents, tokens=result.tokens, rate=f"{rate:,.0f} tok/s")


def _require_text(read, inputs) -> None:
    """Fail early (before training a tokenizer) on a corpus without text or a bad first line."""
    skipped = SkipLog()
    if not any(any(record.texts) for record in read(skipped)):
        bad = f" ({skipped.count} bad lines skipped)" if skipped.count else ""
        raise CorpusError(f"empty corpus: no text in {', '.join(map(str, inputs))}{bad}", "check the input files and --json-keys")
