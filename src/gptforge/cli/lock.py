"""``gptforge lock``: solve pixi.lock and envs/ offline; ``gptforge lock check``: verify them."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "solve pixi.lock and envs/<env>/ from the record store (the offline builder), or check them"


def register(subparsers, groups) -> None:
    parser = subparsers.add_parser("lock", help=HELP, description=HELP)
    _common(parser)
    parser.add_argument("--refresh-pypi", action="store_true",
                        help="re-resolve the PyPI part with uv against the registry, keeping the locked versions "
                             "where they still fit (else the locked part is kept as it is)")
    parser.add_argument("--upgrade-pypi", action="store_true",
                        help="re-resolve the PyPI part to the newest versions that fit")
    parser.add_argument("--wheel-dir", type=Path, metavar="DIR",
                        help="wheels of a per-package index that cannot be reached from here")
    parser.add_argument("--exports-only", action="store_true",
                        help="only rewrite envs/<env>/ from the pixi.lock there (after `pixi lock`)")
    parser.set_defaults(func=run_build)
    sub = parser.add_subparsers(dest="lock_command", metavar="COMMAND")
    check = sub.add_parser("check", help="the lock against pixi.toml, the record store and the compat engine")
    _common(check)
    check.add_argument("--online", action="store_true", help="also compare every PyPI sha256 with its registry")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=run_check)
    imp = sub.add_parser("import-records", help="fill envs/records/ from public pixi.lock files")
    _common(imp)
    imp.add_argument("sources", type=Path, help="directory with PROVENANCE.tsv and <blob>.lock files")
    imp.add_argument("--mapping", type=Path, required=True, help="parselmouth's compressed_mapping.json")
    imp.add_argument("--mapping-source", required=True, help="URL of that mapping at its commit")
    imp.set_defaults(func=run_import)


def _common(parser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("pixi.toml"), metavar="PATH",
                        help="the pixi.toml (default: ./pixi.toml); its directory holds pixi.lock and envs/")


def _load(args):
    from gptforge.lock import manifest, store

    m = manifest.load(args.manifest)
    return m, store.Store(m.root / "envs" / "records")


def run_build(args) -> int:
    from gptforge.lock.build import build

    m, st = _load(args)
    if args.exports_only:
        from gptforge.lock import exports, pixilock

        exports.write_all(m, pixilock.read(m.root / "pixi.lock"), m.root)
        print("wrote envs/*/ from pixi.lock")
        return 0
    for r in build(m, st, refresh_pypi=args.refresh_pypi, upgrade_pypi=args.upgrade_pypi, wheel_dir=args.wheel_dir):
        print(f"{r.name}: {r.conda} conda + {r.pypi} PyPI packages, conda solve {r.seconds:.2f} s, PyPI {r.pypi_source}")
    print(f"wrote {m.root / 'pixi.lock'} and envs/*/")
    return 0


def run_check(args) -> int:
    from gptforge.lock import pixilock
    from gptforge.lock.check import check

    m, st = _load(args)
    problems = check(m, st)
    online = None
    if args.online:
        from gptforge.lock.online import check_online

        online = check_online(m, pixilock.read(m.root / "pixi.lock"))
        problems += online.problems
    if args.json:
        doc = {"ok": not problems, "problems": [p.__dict__ for p in problems]}
        if online:
            doc["online"] = {"checked": online.checked, "mismatches": len(online.problems),
                             "unverifiable": online.unverifiable}
        print(json.dumps(doc, indent=1))
    else:
        for p in problems:
            print(p.line())
        if online:
            for line in online.unverifiable:
                print(line)
            print(f"online: {online.checked} PyPI files checked, {len(online.problems)} mismatches, "
                  f"{len(online.unverifiable)} not checkable from here")
        print("lock check: ok" if not problems else f"lock check: {len(problems)} problems")
    return 1 if problems else 0


def run_import(args) -> int:
    from gptforge.lock import store

    m, st = _load(args)
    roots = {n for e in m.environments.values() for n in e.conda}
    kept = store.import_locks(st, args.sources, roots)
    try:
        mapping = json.loads(args.mapping.read_text())
    except (OSError, ValueError) as err:
        from gptforge.errors import UsageError

        raise UsageError("--mapping", f"cannot read {args.mapping}: {err}")
    store.write_mapping(st, mapping, args.mapping_source)
    print(f"{kept} records written to {st.root}")
    return 0
