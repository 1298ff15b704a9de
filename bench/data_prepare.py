"""Prepare throughput, tokens/s at 1 and 2 workers: ``gptforge prepare`` vs Megatron's preprocess_data.py.

    python bench/data_prepare.py [--copies 8] [--workers 1 2]

The corpus is the embedded default corpus (Python documentation, JSON lines) repeated ``--copies``
times; both tools tokenize it with the original GPT-2 vocab.json/merges.txt and ``--append-eod``.
Times are wall-clock for the whole command (interpreter start, imports, tokenization, writing);
tokens/s divides the tokens written by that time. Both outputs are compared byte for byte.

Megatron's column needs its source (``MEGATRON_LM_SRC`` or ``--megatron-src``) and an interpreter
that can run its script (``MEGATRON_PYTHON`` or ``--megatron-python``): it imports megatron.core
(torch, and triton through its MoE kernels), megatron.training (Python >= 3.12: typing.override)
and transformers. Its ``GPT2BPETokenizer`` type now asks the Hugging Face hub for the "gpt2"
tokenizer config even when given --vocab-file/--merge-file, which fails offline; the script's
``HuggingFaceTokenizer`` type is given instead a local directory holding the same two GPT-2 files
and a tokenizer_config.json (GPT2Tokenizer, eos <|endoftext|>), with HF_HUB_OFFLINE=1. Writes
``data_prepare.json`` to ``$GPTFORGE_BENCH_OUT`` when set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gptforge.data.default_corpus import write_corpus_jsonl
from gptforge.data.indexed import IndexedDataset
from gptforge.data.tokenizer import packaged_gpt2_files


def make_corpus(path: Path, copies: int) -> int:
    one = path.with_name("one.jsonl")
    documents, _ = write_corpus_jsonl(one)
    with open(path, "wb") as out:
        for _ in range(copies):
            out.write(one.read_bytes())
    return documents * copies


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - start, proc


def gptforge_cmd(corpus, prefix, vocab, merges, workers) -> list[str]:
    exe = shutil.which("gptforge", path=str(Path(sys.executable).parent)) or "gptforge"
    return [exe, "prepare", "--input", str(corpus), "--output-prefix", str(prefix), "--tokenizer", "gpt2",
            "--vocab-file", str(vocab), "--merge-file", str(merges), "--append-eod", "--workers", str(workers), "--json"]


def hf_gpt2_dir(directory: Path, vocab: Path, merges: Path) -> Path:
    """The GPT-2 files as a local Hugging Face tokenizer directory (what AutoTokenizer loads offline)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(vocab, directory / "vocab.json")
    shutil.copy(merges, directory / "merges.txt")
    eod = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": eod, "eos_token": eod, "unk_token": eod,
              "add_prefix_space": False, "model_max_length": 10**9}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def megatron_cmd(python, src, corpus, prefix, tokenizer_dir, workers) -> list[str]:
    return [python, str(Path(src) / "tools/preprocess_data.py"), "--input", str(corpus), "--output-prefix", str(prefix),
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer_dir),
            "--append-eod", "--workers", str(workers)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8, help="times the default corpus is repeated")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--megatron-src", default=os.environ.get("MEGATRON_LM_SRC"))
    parser.add_argument("--megatron-python", default=os.environ.get("MEGATRON_PYTHON", sys.executable))
    args = parser.parse_args()
    vocab, merges = packaged_gpt2_files()
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        documents = make_corpus(corpus, args.copies)
        print(f"corpus: {documents:,} documents, {corpus.stat().st_size / 1e6:.1f} MB (default corpus x {args.copies})")
        ours_files = None
        for workers in args.workers:
            prefix = tmp / f"ours_w{workers}"
            seconds, proc = timed(gptforge_cmd(corpus, prefix, vocab, merges, workers))
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            out = Path(f"{prefix}_text_document")
            tokens = IndexedDataset(out).num_tokens
            inner = json.loads(proc.stdout)["seconds"]
            rows.append(("gptforge prepare", workers, seconds, tokens, inner, ""))
            ours_files = ours_files or out
        if args.megatron_src:
            tokenizer_dir = hf_gpt2_dir(tmp / "hf-gpt2", vocab, merges)
            for workers in args.workers:
                prefix = tmp / f"meg_w{workers}"
                cmd = megatron_cmd(args.megatron_python, args.megatron_src, corpus, prefix, tokenizer_dir, workers)
                seconds, proc = timed(cmd, env={"HF_HUB_OFFLINE": "1"})
                out = Path(f"{prefix}_text_document")
                if proc.returncode != 0 or not Path(f"{out}.idx").is_file():
                    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                    notes.append(f"Megatron preprocess_data.py with {args.megatron_python} failed: {last}")
                    break
                same = all(sha256(Path(f"{out}{s}")) == sha256(Path(f"{ours_files}{s}")) for s in (".bin", ".idx"))
                rows.append(("Megatron preprocess_data.py", workers, seconds, IndexedDataset(out).num_tokens, None,
                             "identical .bin/.idx" if same else "DIFFERENT files"))
        else:
            notes.append("Megatron-LM source not given (MEGATRON_LM_SRC): its rows are skipped")
    print(f"\n{'tool':<28} {'workers':>7} {'wall s':>8} {'tokens':>11} {'tokens/s':>11} {'(tokenize+write)':>17}  output")
    for tool, workers, seconds, tokens, inner, note in rows:
        inner_rate = f"{tokens / inner:,.0f}" if inner else "-"
        print(f"{tool:<28} {workers:>7} {seconds:>8.2f} {tokens:>11,} {tokens / seconds:>11,.0f} {inner_rate:>17}  {note}")
    for note in notes:
        print(note)
    out = os.environ.get("GPTFORGE_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        report = [dict(zip(("tool", "workers", "wall_seconds", "tokens", "inner_seconds", "note"), r)) for r in rows]
        (Path(out) / "data_prepare.json").write_text(json.dumps({"rows": report, "notes": notes, "cpus": os.cpu_count()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
