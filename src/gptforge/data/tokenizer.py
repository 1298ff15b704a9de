"""Tokenizers: GPT-2 BPE from vocab.json + merges.txt, or a byte-level BPE trained on a corpus.

Both are byte-level BPEs described by the same two files (Megatron's GPT2BPETokenizer inputs), so
one class serves both: tiktoken encodes files in GPT-2's layout, Hugging Face ``tokenizers`` trains
and encodes the others. ``<|endoftext|>`` is the end-of-document
token; text that happens to contain that string is encoded as ordinary text (as Megatron and
tiktoken's ``encode_ordinary`` do).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from gptforge.core.dataspec import TOKENIZER_KINDS
from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.paths import not_a_file
from gptforge.reading import MAX_BYTES, read_json, read_text
from gptforge.storage import publish_dir, write_failed, writing

EOD_TOKEN = "<|endoftext|>"
VOCAB_NAME = "vocab.json"
MERGES_NAME = "merges.txt"
TRAINED_FILES = (VOCAB_NAME, MERGES_NAME, "tokenizer_meta.json", "tokenizer_config.json")  # what train_bytelevel writes
PIECE_CHARS = 1 << 20  # longer documents are tokenized piece by piece (see ``pieces``)
# BPE's time (training and encoding) grows with the square of a word's length: a megabyte without a space took
# minutes. Runs of non-space characters longer than this are cut; no word of ordinary text is that long.
LONGEST_WORD = 1 << 12
_LONG_RUN = re.compile(rf"\S{{{LONGEST_WORD + 1},}}")


class TokenizerError(GptforgeError):
    """Tokenizer files are missing or wrong."""


class Tokenizer:
    """Byte-level BPE: ``encode``/``decode``/``encode_batch``, ``vocab_size``, ``eod_id``.

    Files in GPT-2's layout (byte tokens in GPT-2 order, then one new token per merge, which
    tiktoken's loader verifies) are encoded by tiktoken, about four times faster; any other
    vocabulary (e.g. one trained here) by Hugging Face ``tokenizers``. ``backend`` forces one.
    """

    def __init__(self, vocab_file: str | os.PathLike, merge_file: str | os.PathLike, name: str, backend: str = "auto"):
        for path, flag in ((vocab_file, "--vocab-file"), (merge_file, "--merge-file")):
            problem = not_a_file(path)
            if problem:
                raise UsageError(flag, f"{path} {problem}", "give the path of an existing file")
            if os.path.getsize(path) > MAX_BYTES:  # the tokenizer libraries read the whole file into memory
                raise UsageError(flag, f"{path} is larger than {MAX_BYTES >> 20} MiB, more than any BPE vocabulary needs",
                                 BPE_FIX)
        self.name, self.backend = name, backend
        self.vocab_file, self.merge_file = Path(vocab_file), Path(merge_file)
        vocab = _read_vocab(self.vocab_file)
        if EOD_TOKEN not in vocab:
            raise TokenizerError(f"{vocab_file} has no {EOD_TOKEN} token", "the end-of-document token must be in the vocabulary")
        self.eod_id: int = vocab[EOD_TOKEN]
        self.vocab_size: int = len(vocab)
        self._tiktoken = _tiktoken_encoding(_file_key(self.vocab_file), _file_key(self.merge_file)) if backend in ("auto", "tiktoken") else None
        if backend == "tiktoken" and self._tiktoken is None:
            raise TokenizerError(f"{vocab_file}: not in GPT-2's layout, tiktoken cannot encode it")
        self._hf = None if self._tiktoken is not None else _hf_tokenizer(self.vocab_file, self.merge_file)
        self.engine = "tiktoken" if self._tiktoken is not None else "tokenizers"

    def record(self) -> dict:
        """What a dataset records about the tokenizer that made it (``data merge`` compares these)."""
        return {"kind": self.name, "vocab_size": self.vocab_size, "eod_id": self.eod_id,
                "vocab_sha256": _sha256(self.vocab_file), "merges_sha256": _sha256(self.merge_file)}

    def encode(self, text: str) -> list[int]:
        return [i for piece in pieces(text) for i in self._encode_piece(piece)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if any(len(t) > PIECE_CHARS or _LONG_RUN.search(t) for t in texts):  # cut as ``encode`` cuts
            return [self.encode(t) for t in texts]
        if self._tiktoken is not None:
            return [self._tiktoken.encode_ordinary(t) for t in texts]
        return [e.ids for e in self._hf.encode_batch(texts)]

    def encode_array(self, text: str, dtype) -> np.ndarray:
        """``encode`` as an array, piece by piece: a document of any length in bounded memory."""
        return np.concatenate([np.asarray(self._encode_piece(p), dtype=dtype) for p in pieces(text)])

    def _encode_piece(self, text: str) -> list[int]:
        if self._tiktoken is not None:
            return self._tiktoken.encode_ordinary(text)
        return self._hf.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        if self._tiktoken is not None:
            return self._tiktoken.decode(list(ids))
        return self._hf.decode(list(ids), skip_special_tokens=False)

    def __getstate__(self):  # picklable for worker processes
        fields = ("vocab_file", "merge_file", "name", "backend", "eod_id", "vocab_size", "engine")
        # a tiktoken Encoding pickles its ranks (~25 ms to restore; re-reading the files takes ~0.5 s)
        return {**{f: getattr(self, f) for f in fields}, "tiktoken": self._tiktoken}

    def __setstate__(self, state):
        if state["tiktoken"] is None:  # Hugging Face tokenizers: reload from the files
            self.__init__(state["vocab_file"], state["merge_file"], state["name"], state["backend"])
            return
        self.__dict__.update({k: v for k, v in state.items() if k != "tiktoken"})
        self._tiktoken, self._hf = state["tiktoken"], None


def pieces(text: str, size: int | None = None) -> Iterator[str]:
    """``text`` in pieces of at most about ``size`` characters, for tokenizing long documents in bounded memory
    (one 200 MB line took over 20 GB whole).

    A piece ends before a space that follows a non-space and precedes one: GPT-2's pre-tokenizer starts a
    new word there whatever follows, so the pieces' tokens are the whole text's. A stretch of ``size``
    characters without such a space is cut where it ends, and a run of non-space characters longer than
    LONGEST_WORD every LONGEST_WORD characters (the only places the tokens can differ).
    """
    size = size or PIECE_CHARS
    start = 0
    while len(text) - start > size:
        cut = _word_start(text, start, start + size)
        yield from _cut_long_runs(text[start:cut])
        start = cut
    yield from _cut_long_runs(text[start:])


def _cut_long_runs(piece: str) -> Iterator[str]:
    """``piece``, cut inside each run of more than LONGEST_WORD non-space characters (and nowhere else)."""
    start = 0
    for run in _LONG_RUN.finditer(piece):
        for cut in range(run.start() + LONGEST_WORD, run.end(), LONGEST_WORD):
            yield piece[start:cut]
            start = cut
    yield piece[start:]


def _word_start(text: str, start: int, end: int) -> int:
    i = end
    while (i := text.rfind(" ", start + 1, i)) > start:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
    return end


def _read_vocab(path: Path) -> dict[str, int]:
    fix = "give a vocab.json of token -> id (GPT-2's, or one gptforge prepare wrote)"
    try:
        vocab = read_json(path, max_depth=1, expect=dict, fix=fix)
    except FileReadError as err:
        raise TokenizerError(err.message, err.fix) from None
    bad = next((token for token, i in vocab.items() if isinstance(i, bool) or not isinstance(i, int) or i < 0), None)
    if bad is not None:
        raise TokenizerError(f"{path}: token {bad!r} maps to {vocab[bad]!r}, not a token id", fix)
    return vocab


def _hf_tokenizer(vocab_file: Path, merge_file: Path):
    from tokenizers import ByteLevelBPETokenizer

    try:
        return ByteLevelBPETokenizer.from_file(str(vocab_file), str(merge_file))
    except Exception:  # the library raises plain Exception on malformed files, in words of its own
        raise TokenizerError(f"cannot load BPE files {vocab_file}, {merge_file}: {_bpe_problem(vocab_file, merge_file)}",
                             BPE_FIX) from None


BPE_FIX = "give the vocab.json and merges.txt of one tokenizer, e.g. those gptforge prepare wrote"


def _bpe_problem(vocab_file: Path, merge_file: Path) -> str:
    """What is wrong with a pair of BPE files the library refused, in our words."""
    vocab = _read_vocab(vocab_file)
    if len(set(vocab.values())) != len(vocab):
        return f"two tokens of {vocab_file.name} share one id"
    for number, line in enumerate(read_text(merge_file, fix=BPE_FIX).splitlines(), 1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            return f"{merge_file.name} line {number} is not two tokens separated by one space"
        missing = next((t for t in (*parts, "".join(parts)) if t not in vocab), None)
        if missing is not None:
            return f"{merge_file.name} line {number} names {missing!r}, which {vocab_file.name} does not hold"
    return "the two files do not make one byte-level BPE tokenizer"


# GPT-2's pre-tokenizer regex as tiktoken writes it (tiktoken_ext/openai_public.py, r50k_pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _tiktoken_encoding(vocab_key: tuple[str, int, int], merge_key: tuple[str, int, int]):
    """A tiktoken Encoding when the files have GPT-2's layout, else None (cached per file version)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read local files directly; never copy them to a cache
    vocab_file, merge_file = Path(vocab_key[0]), Path(merge_key[0])
    vocab = _read_vocab(vocab_file)
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(str(merge_file), str(vocab_file))
    except (AssertionError, KeyError, ValueError, UnicodeDecodeError):
        return None
    finally:
        if saved is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR")
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    specials = {t: i for t, i in vocab.items() if t in (EOD_TOKEN, "<|startoftext|>")}
    if len(ranks) + len(specials) != len(vocab):
        return None
    return tiktoken.Encoding(
        vocab_file.stem, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials, explicit_n_vocab=len(vocab)
    )


def _gpt2_facts() -> dict:
    return tomllib.loads((Path(__file__).with_name("gpt2_files.toml")).read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def packaged_gpt2_files() -> tuple[Path, Path]:
    """The original GPT-2 vocab/merges shipped with gptforge, checked by sha256."""
    facts = _gpt2_facts()
    shipped = facts["shipped"]
    root = Path(__file__).with_name(shipped["directory"])
    vocab, merges = root / shipped["vocab"], root / shipped["merges"]
    for path, key in ((vocab, "vocab"), (merges, "merges")):
        if not path.is_file() or _sha256(path) != facts[key]["sha256"]:
            raise TokenizerError(f"{path} is not the original GPT-2 {key} file (missing, or its sha256 differs)",
                                 "reinstall gptforge")
    return vocab, merges


def load_tokenizer(
    kind: str,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    vocab_file: str | os.PathLike | None = None,
    merge_file: str | os.PathLike | None = None,
) -> Tokenizer:
    """Load ``gpt2`` (explicit files, a directory, or the packaged originals) or ``bytelevel`` (a directory)."""
    if kind not in TOKENIZER_KINDS:
        raise UsageError("--tokenizer", f"unknown tokenizer {kind!r}", f"choose one of {', '.join(TOKENIZER_KINDS)}")
    if (vocab_file is None) != (merge_file is None):
        raise UsageError("--vocab-file", "--vocab-file and --merge-file go together", "give both or neither")
    if vocab_file is None and tokenizer_dir is not None:
        vocab_file, merge_file = Path(tokenizer_dir) / VOCAB_NAME, Path(tokenizer_dir) / MERGES_NAME
        if not Path(vocab_file).is_file():
            raise UsageError("--tokenizer-dir", f"{vocab_file} not found", "the directory must hold vocab.json and merges.txt")
    if vocab_file is None:
        if kind == "bytelevel":
            raise UsageError("--tokenizer-dir", "a bytelevel tokenizer needs its directory", "pass --tokenizer-dir (prepare trains one there when it is empty)")
        vocab_file, merge_file = packaged_gpt2_files()
    return Tokenizer(vocab_file, merge_file, kind)


MAX_VOCAB_SIZE = 2**20  # the trainer reserves memory per requested token (10**9 asks for 70 GB and aborts)


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < 257:
        raise UsageError("--vocab-size", f"{vocab_size} is too small", "a byte-level BPE needs at least 257 tokens (256 bytes + end of document)")
    if vocab_size > MAX_VOCAB_SIZE:
        raise UsageError("--vocab-size", f"{vocab_size} is larger than {MAX_VOCAB_SIZE:,}",
                         "GPT vocabularies hold 8k to 256k tokens, e.g. --vocab-size 50257")


def train_bytelevel(texts: Iterable[str], out_dir: str | os.PathLike, *, vocab_size: int = 8192) -> Tokenizer:
    """Train a byte-level BPE on ``texts`` and save vocab.json + merges.txt in ``out_dir`` (atomically)."""
    from tokenizers import ByteLevelBPETokenizer

    check_vocab_size(vocab_size)
    out_dir = Path(out_dir)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD_TOKEN], show_progress=False)
    try:
        _save_trained(tok, out_dir)
    except Exception as err:  # OSError, or the tokenizers library's plain Exception for a failed write
        raise write_failed(out_dir, err) from None
    return Tokenizer(out_dir / VOCAB_NAME, out_dir / MERGES_NAME, "bytelevel")


def publish_trained(staging: Path, final: Path) -> Tokenizer:
    """Move a tokenizer trained into ``staging`` to ``final``: the directory renamed whole when
    ``final`` is new, else its files moved in (``final`` holds no vocab.json, or it would have been used)."""
    with writing(final):
        if not os.path.lexists(final):
            publish_dir(staging, final)
        else:
            for name in TRAINED_FILES:
                os.replace(staging / name, final / name)
            shutil.rmtree(staging, ignore_errors=True)
    return Tokenizer(final / VOCAB_NAME, final / MERGES_NAME, "bytelevel")


def _save_trained(tok, out_dir: Path) -> None:
    """Write the trained files in a temporary directory inside ``out_dir``, then rename them into it."""
    out_dir.mkdir(parents=True, exist_ok=True)  # only now: a failed training leaves nothing behind
    tmp = out_dir / f".train-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    try:
        _write_trained(tok, tmp)
        for name in TRAINED_FILES:
            os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_trained(tok, tmp: Path) -> None:
    tok.save_model(str(tmp))
    meta = {"kind": "bytelevel", "vocab_size": tok.get_vocab_size(), "eod": EOD_TOKEN}
    (tmp / "tokenizer_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    # lets Hugging Face AutoTokenizer (and Megatron's HuggingFaceTokenizer) load the directory
    hf_config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOD_TOKEN, "eos_token": EOD_TOKEN,
                 "unk_token": EOD_TOKEN, "add_prefix_space": False, "model_max_length": 10**9}
    (tmp / "tokenizer_config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
