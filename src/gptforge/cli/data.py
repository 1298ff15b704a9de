"""CLI for the data commands: ``prepare``, ``data inspect``, ``data merge``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptforge.cli import group
from gptforge.core.dataspec import TOKENIZER_KINDS

PREPARE_EPILOG = """\
outputs: <output-prefix>_<key>_document.bin/.idx for every --json-keys key (Megatron's naming, so
  --output-prefix data/my-gpt2 gives data/my-gpt2_text_document). Files appear only when complete.
formats: jsonl (one JSON object per line), parquet (columns named by --json-keys), text (each file
  is one document); chosen from the file suffix unless --format is given.
tokenizers: gpt2 reads --vocab-file/--merge-file (Megatron's gpt2-vocab.json/gpt2-merges.txt) or
  --tokenizer-dir, else the original GPT-2 files shipped with gptforge (sha256-checked); bytelevel
  loads --tokenizer-dir (only ever read), or trains a byte-level BPE of --vocab-size tokens on the
  corpus and saves it beside the output (<output-prefix>_tokenizer).
examples:
  gptforge prepare --input corpus.jsonl --output-prefix data/my-gpt2 --tokenizer gpt2 \\
      --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod --workers 8
  gptforge prepare --default-corpus data/stdlib     # the embedded corpus, offline
"""


def register(subparsers, groups) -> None:
    _register_prepare(subparsers)
    data = group(subparsers, groups, "data", "Inspect and combine Megatron .bin/.idx datasets")
    inspect = data.add_parser("inspect", help="validate a .bin/.idx pair and summarise it",
                              description="Validate PREFIX.bin/.idx (magic, version, counts, pointers, .bin size) "
                                          "and print documents, sequences, tokens, dtype, token-id range and a checksum.")
    inspect.add_argument("prefix", metavar="PREFIX", help="dataset prefix, or its .bin or .idx file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(func=run_inspect)
    merge = data.add_parser("merge", help="concatenate datasets into one prefix",
                            description="Concatenate several datasets made with one tokenizer into OUTPUT_PREFIX.bin/.idx.")
    merge.add_argument("--input", nargs="+", required=True, metavar="PREFIX", help="prefixes to merge, in order")
    merge.add_argument("--output-prefix", required=True, help="prefix of the merged dataset")
    merge.add_argument("--json", action="store_true", help="print one JSON object")
    merge.set_defaults(func=run_merge)


def _register_prepare(subparsers) -> None:
    p = subparsers.add_parser("prepare", help="tokenize a corpus into Megatron .bin/.idx files",
                              description="Tokenize JSON lines, parquet or text into Megatron-compatible "
                                          "indexed datasets (MMIDIDX v1), like Megatron's preprocess_data.py.",
                              epilog=PREPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", metavar="PATH", help="input files")
    p.add_argument("--format", choices=("jsonl", "parquet", "text"), help="input format (default: from suffix)")
    p.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY", help="fields to tokenize (default: text)")
    p.add_argument("--output-prefix", help="output prefix P: writes P_<key>_document.bin/.idx")
    p.add_argument("--tokenizer", choices=TOKENIZER_KINDS, default="gpt2", help="tokenizer (default: gpt2)")
    p.add_argument("--vocab-file", help="GPT-2 style vocab.json")
    p.add_argument("--merge-file", help="GPT-2 style merges.txt")
    p.add_argument("--tokenizer-dir", help="directory with vocab.json + merges.txt, only read (a bytelevel tokenizer "
                   "is trained into <output-prefix>_tokenizer when no --tokenizer-dir is given)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size of a trained bytelevel tokenizer (default 8192)")
    p.add_argument("--append-eod", action="store_true", help="append <|endoftext|> to every non-empty document")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed lines instead of stopping (counted)")
    p.add_argument("--default-corpus", metavar="DIR", help="prepare the embedded Python-documentation corpus in DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_prepare)


def _show_progress(args) -> bool:
    return sys.stderr.isatty() and not args.json


def run_prepare(args) -> int:
    from gptforge.errors import UsageError

    if args.default_corpus:
        if args.input or args.output_prefix:
            raise UsageError("--default-corpus", "prepares the embedded corpus only; --input and --output-prefix "
                             "would be ignored", "drop --default-corpus to prepare your files, or drop --input/--output-prefix")
        return _run_default_corpus(args)
    if not args.input:
        raise UsageError("--input", "no input files", "give --input PATH... (or --default-corpus DIR)")
    if not args.output_prefix:
        raise UsageError("--output-prefix", "missing", "e.g. --output-prefix data/my-gpt2")
    from gptforge.data.prepare import prepare

    result = prepare(
        args.input, args.output_prefix, tokenizer=args.tokenizer, fmt=args.format, json_keys=args.json_keys,
        vocab_file=args.vocab_file, merge_file=args.merge_file, tokenizer_dir=args.tokenizer_dir,
        vocab_size=args.vocab_size, append_eod=args.append_eod, workers=args.workers,
        skip_bad_lines=args.skip_bad_lines, progress=_show_progress(args),
    )
    report = {
        "prefixes": {k: str(v) for k, v in result.prefixes.items()},
        "tokenizer": args.tokenizer, "tokenizer_engine": result.tokenizer.engine,
        "tokenizer_dir": str(result.tokenizer_dir) if result.tokenizer_dir else None,
        "vocab_size": result.tokenizer.vocab_size, "documents": result.documents, "tokens": result.tokens,
        "seconds": round(result.seconds, 3), "tokens_per_second": round(result.tokens_per_second),
        "skipped_lines": result.skipped.count, "first_skipped": result.skipped.first,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key, prefix in result.prefixes.items():
        print(f"wrote {prefix}.bin/.idx ({key})")
    print(f"{result.documents:,} documents, {result.tokens:,} tokens in {result.seconds:.1f} s "
          f"({result.tokens_per_second:,.0f} tokens/s, {args.workers} worker(s), {result.tokenizer.engine})")
    if result.tokenizer_dir:
        print(f"tokenizer: {result.tokenizer_dir}")
    if result.skipped.count:
        print(f"skipped {result.skipped.count} bad line(s); first: {result.skipped.first[0]}")
    return 0


def _run_default_corpus(args) -> int:
    from gptforge.data.default_corpus import prepare_default

    paths = prepare_default(Path(args.default_corpus), vocab_size=args.vocab_size or 8192, progress=_show_progress(args))
    report = {"prefix": str(paths.prefix), "tokenizer_dir": str(paths.tokenizer_dir), **paths.manifest}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        m = paths.manifest
        print(f"default corpus (Python {m['python']} documentation): {m['documents']:,} documents, {m['tokens']:,} tokens")
        print(f"data: {paths.prefix}  tokenizer: {paths.tokenizer_dir}")
    return 0


def run_inspect(args) -> int:
    from gptforge.data.summary import summarize

    s = summarize(args.prefix)
    if args.json:
        print(json.dumps(s.as_dict(), indent=2))
        return 0
    from rich.table import Table

    from gptforge.terminal import stdout_console

    table = Table(title=f"{s.prefix}", title_justify="left", show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # a value too wide for the terminal goes on over lines, never cut
    rows = [
        ("documents", f"{s.documents:,}" + (f" ({s.empty_documents:,} empty)" if s.empty_documents else "")),
        ("sequences", f"{s.sequences:,}"), ("tokens", f"{s.tokens:,}"),
        ("dtype", f"{s.dtype} (code {s.dtype_code})"),
        ("token ids", f"{s.min_token} .. {s.max_token}" if s.min_token is not None else "-"),
        ("sequence length", f"min {s.min_sequence_length}, mean {s.mean_sequence_length}, max {s.max_sequence_length}"
         if s.min_sequence_length is not None else "-"),
        ("bytes", f".bin {s.bin_bytes:,}, .idx {s.idx_bytes:,}"), ("bin sha256", s.bin_sha256),
    ]
    for name, value in rows:
        table.add_row(name, value)
    stdout_console().print(table)
    return 0


def run_merge(args) -> int:
    from gptforge.data.indexed import merge_datasets

    ds = merge_datasets(args.input, args.output_prefix)
    report = {"prefix": args.output_prefix, "documents": ds.num_documents, "sequences": len(ds), "tokens": ds.num_tokens}
    print(json.dumps(report, indent=2) if args.json else
          f"wrote {args.output_prefix}.bin/.idx: {ds.num_documents:,} documents, {ds.num_tokens:,} tokens")
    return 0

