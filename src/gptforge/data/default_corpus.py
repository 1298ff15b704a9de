"""The embedded default corpus: the Python standard library's own documentation.

Documents, in this order: every topic of ``pydoc_data.topics`` (sorted by name), then one document
per standard-library module (sorted by name) holding the module docstring and the docstrings of its
classes, functions and methods, read from the source with ``ast`` (nothing is imported). Test
packages are left out. The text is a function of the Python version: the same Python release gives
the same bytes on every machine; another release (even a patch release, whose documentation and
docstrings change) gives a slightly different corpus, so its hash and the Python version are
recorded in ``manifest.json`` beside the data.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.reading import read_json
from gptforge.storage import atomic_path, build_once, write_atomic, writing

CORPUS_NAME = "stdlib_docs"
CORPUS_FORMAT = 2  # bump when the assembly below or the saved files change
SKIP_PARTS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


@dataclass(frozen=True)
class DataPaths:
    prefix: Path  # <out_dir>/stdlib_docs_text_document (.bin/.idx beside it)
    tokenizer_dir: Path
    manifest: dict

    @property
    def bin(self) -> Path:
        return Path(f"{self.prefix}.bin")

    @property
    def idx(self) -> Path:
        return Path(f"{self.prefix}.idx")


def _pydoc_topics() -> Iterator[str]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield f"{name}\n\n{topics[name].strip()}\n"


def _module_files() -> Iterator[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in sorted(sys.stdlib_module_names):
        package = stdlib / name
        if package.is_dir() and name not in SKIP_PARTS:
            files = sorted(p for p in package.rglob("*.py") if not SKIP_PARTS.intersection(p.relative_to(stdlib).parts))
            for path in files:
                module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
                yield module, path
        elif (stdlib / f"{name}.py").is_file():
            yield name, stdlib / f"{name}.py"


def _docstrings(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(qualified name, cleaned docstring) of the module and its classes/functions, source order."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop(0)
        doc = ast.get_docstring(node, clean=True) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if doc:
            yield prefix, doc
        children = [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        stack[0:0] = [(f"{prefix}.{c.name}" if prefix else c.name, c) for c in children]


def _module_documents() -> Iterator[str]:
    for module, path in _module_files():
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # e.g. lib2to3 grammar fixtures
            continue
        parts = [f"{module}.{name}\n\n{doc}" if name else f"{module}\n\n{doc}" for name, doc in _docstrings(tree)]
        if parts:
            yield "\n\n".join(parts) + "\n"


def corpus_documents() -> Iterator[str]:
    """The default corpus, one string per document, deterministic for a Python release."""
    yield from _pydoc_topics()
    yield from _module_documents()


def write_corpus_jsonl(path: Path) -> tuple[int, str]:
    """Write the corpus as JSON lines (``{"text": ...}``); returns (documents, sha256 of the file)."""
    digest = hashlib.sha256()
    count = 0
    with writing(path), atomic_path(path) as tmp, open(tmp, "wb") as f:
        for text in corpus_documents():
            line = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode("utf-8")
            digest.update(line)
            f.write(line)
            count += 1
    return count, digest.hexdigest()


def _expected_manifest(vocab_size: int) -> dict:
    return {
        "corpus": CORPUS_NAME,
        "format": CORPUS_FORMAT,
        "python": sys.version.split()[0],
        "vocab_size": vocab_size,
        "tokenizer": "bytelevel",
        "append_eod": True,
    }


def _cached(out_dir: Path, expected: dict) -> DataPaths | None:
    path = out_dir / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = read_json(path, expect=dict)
    except FileReadError:  # damaged, deep, not UTF-8, not a regular file: built again
        return None
    sizes = manifest.get("file_bytes")
    if any(manifest.get(k) != v for k, v in expected.items()) or not isinstance(sizes, dict) \
            or not isinstance(manifest.get("tokens"), int):
        return None
    paths = DataPaths(out_dir / f"{CORPUS_NAME}_text_document", out_dir / "tokenizer", manifest)
    files = {paths.bin.name: paths.bin, paths.idx.name: paths.idx, "vocab.json": paths.tokenizer_dir / "vocab.json",
             "merges.txt": paths.tokenizer_dir / "merges.txt"}
    if all(path.is_file() and path.stat().st_size == sizes.get(name) for name, path in files.items()):
        return paths
    return None  # missing, truncated or grown since it was built: build it again


def prepare_default(out_dir: Path, *, vocab_size: int = 8192, seq_hint: int | None = None, progress: bool = False) -> DataPaths:
    """Assemble, tokenize (byte-level BPE trained on it) and index the default corpus in ``out_dir``.

    Idempotent and cached: a second call with the same Python and vocab size returns the existing
    files at once. Safe to call from several processes at once (a file lock serialises them).
    ``seq_hint``: a sequence length the caller will train with; an error if the corpus is shorter.
    """
    from gptforge.data.prepare import prepare

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError("--default-corpus", f"cannot create {out_dir}: {err.strerror or err}", "give a directory you can write to") from None
    expected = _expected_manifest(vocab_size)
    paths = build_once(out_dir / ".prepare.lock", lambda: _cached(out_dir, expected),
                       lambda: _build(out_dir, expected, vocab_size, progress, prepare))
    if seq_hint is not None and paths.manifest["tokens"] < seq_hint + 1:
        raise GptforgeError(f"the default corpus has {paths.manifest['tokens']} tokens, fewer than one sequence of {seq_hint}")
    return paths


def _build(out_dir: Path, expected: dict, vocab_size: int, progress: bool, prepare) -> DataPaths:
    corpus = out_dir / f"{CORPUS_NAME}.jsonl"
    documents, sha = write_corpus_jsonl(corpus)
    tokenizer_dir = out_dir / "tokenizer"
    for stale in ("vocab.json", "merges.txt"):  # retrain: the vocab size or Python may have changed
        (tokenizer_dir / stale).unlink(missing_ok=True)
    result = prepare(
        [corpus], out_dir / CORPUS_NAME, tokenizer="bytelevel", trained_tokenizer_dir=tokenizer_dir,
        vocab_size=vocab_size, append_eod=True, progress=progress,
    )
    prefix = result.prefixes["text"]
    manifest = {**expected, "documents": documents, "tokens": result.tokens, "corpus_sha256": sha,
                "eod_id": result.tokenizer.eod_id, "tokenizer_vocab_size": result.tokenizer.vocab_size,
                "file_bytes": {p.name: p.stat().st_size for p in (Path(f"{prefix}.bin"), Path(f"{prefix}.idx"),
                                                                   tokenizer_dir / "vocab.json", tokenizer_dir / "merges.txt")}}
    write_atomic(out_dir / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return DataPaths(result.prefixes["text"], tokenizer_dir, manifest)
