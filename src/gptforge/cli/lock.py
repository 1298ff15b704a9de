"""``gptforge lock check``: pixi.lock and envs/ against pixi.toml. Writing them is the maintainers'
task (`pixi run lock`, tasks/lockgen/)."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "check pixi.lock and envs/<env>/ against pixi.toml by pixi's rules"


def register(subparsers, groups) -> None:
    parser = subparsers.add_parser("lock", help=HELP, description=HELP)
    sub = parser.add_subparsers(dest="lock_command", metavar="COMMAND", required=True)
    check = sub.add_parser("check", help="the lock against pixi.toml, the record store and the compat engine")
    _common(check)
    check.add_argument("--online", action="store_true", help="also compare every PyPI sha256 with its registry")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=run_check)


def _common(parser) -> None:
    parser.add_argument("--manifest", type=Path, default=Path("pixi.toml"), metavar="PATH",
                        help="the pixi.toml (default: ./pixi.toml); its directory holds pixi.lock and envs/")


def _load(args):
    from gptforge.lock import manifest, store

    m = manifest.load(args.manifest)
    return m, store.Store(m.root / "envs" / "records")


def run_check(args) -> int:
    from gptforge.lock import lockfile
    from gptforge.lock.check import check

    m, st = _load(args)
    problems = check(m, st)
    online = None
    if args.online:
        from gptforge.lock.online import check_online

        online = check_online(m, lockfile.read_document(m.root / "pixi.lock"))
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
