"""The maintainers' lock commands (pixi.toml's `lock` task, tasks/import_records.py): write pixi.lock
and envs/ offline from the record store, or only the exports, or fill the record store."""

from __future__ import annotations

import sys
from pathlib import Path

from gptforge.cli import OneLineParser
from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.lock import lockfile, manifest
from gptforge.lock.store import Store
from gptforge.reading import read_json


def parser() -> OneLineParser:
    p = OneLineParser(prog="lock", description="solve pixi.lock and envs/<env>/ from the record store (offline)")
    p.add_argument("--manifest", type=Path, default=Path("pixi.toml"), metavar="PATH",
                   help="the pixi.toml (default: ./pixi.toml); its directory holds pixi.lock and envs/")
    p.add_argument("--refresh-pypi", action="store_true",
                   help="re-resolve the PyPI part with uv against the registry, keeping the locked versions "
                        "where they still fit (else the locked part is kept as it is)")
    p.add_argument("--upgrade-pypi", action="store_true", help="re-resolve the PyPI part to the newest versions that fit")
    p.add_argument("--wheel-dir", type=Path, metavar="DIR", help="wheels of a per-package index that cannot be reached from here")
    p.add_argument("--exports-only", action="store_true", help="only rewrite envs/<env>/ from the pixi.lock there (after `pixi lock`)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    imp = sub.add_parser("import-records", help="fill envs/records/ from public pixi.lock files")
    imp.add_argument("sources", type=Path, help="directory with PROVENANCE.tsv and <blob>.lock files")
    imp.add_argument("--mapping", type=Path, required=True, help="parselmouth's compressed_mapping.json")
    imp.add_argument("--mapping-source", required=True, help="URL of that mapping at its commit")
    return p


def run_build(args) -> int:
    from lockgen.build import build
    from lockgen.writer import write_exports

    m = manifest.load(args.manifest)
    if args.exports_only:
        write_exports(m, lockfile.read_document(m.root / "pixi.lock"), m.root)
        print("wrote envs/*/ from pixi.lock")
        return 0
    store = Store(m.root / "envs" / "records")
    for r in build(m, store, refresh_pypi=args.refresh_pypi, upgrade_pypi=args.upgrade_pypi, wheel_dir=args.wheel_dir):
        print(f"{r.name}: {r.conda} conda + {r.pypi} PyPI packages, conda solve {r.seconds:.2f} s, PyPI {r.pypi_source}")
    print(f"wrote {m.root / 'pixi.lock'} and envs/*/")
    return 0


def run_import(args) -> int:
    from lockgen import records

    m = manifest.load(args.manifest)
    store = Store(m.root / "envs" / "records")
    roots = {n for e in m.environments.values() for n in e.conda}
    try:  # read before the store is written: a bad mapping leaves the store as it was
        mapping = read_json(args.mapping, expect=dict, fix="give parselmouth's compressed_mapping.json")
    except FileReadError as err:
        raise UsageError("--mapping", err.message, err.fix) from None
    kept = records.import_locks(store, args.sources, roots)
    records.write_mapping(store, mapping, args.mapping_source)
    print(f"{kept} records written to {store.root}")
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return run_import(args) if args.command == "import-records" else run_build(args)
    except GptforgeError as err:
        sys.stderr.write(f"lock: error: {err.one_line()}\n")
        return err.exit_code
