"""``gptforge fix-links``: repair the CUDA library layout of a conda/pixi environment."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "make a conda/pixi environment usable as CUDA_HOME: lib64, library links, headers"

DESCRIPTION = """\
Repairs the CUDA layout of a conda/pixi environment prefix by creating or replacing symlinks only:
  * lib64 -> lib when lib64 is absent (DeepSpeed links with -L$CUDA_HOME/lib64)
  * libcudart, libcublas, libcublasLt, libnvJitLink, libnvrtc, libcusparse and cuDNN: libX.so and the
    SONAME link libX.so.<major> lead to the real file that belongs to the environment's CUDA
  * include/<name> -> targets/x86_64-linux/include/<name>, so CUDA_HOME=$PREFIX has cuda_runtime.h
It prints the plan, applies it atomically with an undo record, then loads the chosen libcudart in a
fresh process and checks cudaRuntimeGetVersion. Regular files are never moved, changed or deleted.

Exit status: 0 nothing wrong (or all fixed and verified); 1 something cannot be fixed, the prefix is
read-only, or verification failed; 2 usage error (no environment, bad --cuda, not a prefix)."""


def register(subparsers, groups) -> None:
    parser = subparsers.add_parser("fix-links", help=HELP, description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)


def add_arguments(parser) -> None:
    parser.add_argument("--prefix", metavar="DIR",
                        help="environment prefix (default: the active one, $CONDA_PREFIX or the pixi env)")
    parser.add_argument("--cuda", metavar="X.Y",
                        help="CUDA release the libraries must match (default: the env's cuda-version "
                             "package, else the CUDA torch was built with)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan; change nothing. Without --cuda it may still run PREFIX/bin/nvcc "
                             "--version, or load the prefix's libcudart in a child process, to read the CUDA release")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--undo", action="store_true", help="restore the links recorded by the last repair")
    parser.add_argument("--verbose", action="store_true", help="list every planned change and finding "
                                                                "(by default repeated kinds are counted)")
    parser.add_argument("--print-cuda-home", action="store_true",
                        help="print the prefix's CUDA_HOME (conda, NVIDIA wheels or a plain toolkit) and exit")
    parser.add_argument("--allow-system-prefix", action="store_true",
                        help="allow a system directory (/, /usr, /usr/local, /opt, /lib, ...) as the prefix")
    parser.set_defaults(func=run)


def run(args) -> int:
    from gptforge import links
    from gptforge.links.expected import expected_cuda, resolve_prefix

    prefix = resolve_prefix(args.prefix, allow_system=args.allow_system_prefix)
    if args.print_cuda_home:
        return _print_cuda_home(prefix, args)
    if args.undo:
        result, source = links.undo(prefix, dry_run=args.dry_run), None
    else:
        cuda, source = expected_cuda(args.cuda, prefix, dry_run=args.dry_run)
        result = links.fix(prefix, cuda, source=source, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(_as_json(result, source, args.undo), indent=1))
    else:
        _print_text(result, source, args.undo, args.verbose)
    return result.exit_code


def _print_cuda_home(prefix: str, args) -> int:
    from gptforge.errors import UsageError
    from gptforge.probe.cuda_home import find_cuda_home

    others = [flag for flag, on in (("--cuda", args.cuda is not None), ("--dry-run", args.dry_run),
                                    ("--undo", args.undo)) if on]
    if others:
        raise UsageError("--print-cuda-home", f"does not go with {', '.join(others)}", "use it with --prefix only")
    home, layout = find_cuda_home(prefix)
    print(json.dumps({"cuda_home": home, "layout": layout}) if args.json else home)
    return 0


def _as_json(result, source, undo: bool) -> dict:
    from gptforge.links.report import step_kind

    layout = result.layout
    return {
        "ok": result.ok,
        "exit_code": result.exit_code,
        "mode": ("undo" if undo else "fix") + (" (dry run)" if result.dry_run else ""),
        "prefix": layout.prefix,
        "cuda": ".".join(map(str, result.cuda)) if result.cuda else None,
        "cuda_source": source,
        "steps": [{**s.to_json(layout), "kind": step_kind(layout, s)} for s in result.steps],
        "applied": result.applied,
        "chosen": {stem: {"file": layout.rel(c.real), "version": ".".join(map(str, c.version)), "soname": c.soname}
                   for stem, c in result.chosen.items()},
        "verified": [{"path": layout.rel(v.path), "runtime_version": v.version, "error": v.error or None}
                     for v in result.verified],
        "findings": [f.to_json() for f in result.findings],
    }


def _print_text(result, source, undo: bool, verbose: bool) -> None:
    from gptforge.links.report import finding_lines, step_lines

    layout, out = result.layout, sys.stdout
    if result.cuda:
        out.write(f"prefix {layout.prefix}, CUDA {result.cuda[0]}.{result.cuda[1]} (from {source})\n")
    else:
        out.write(f"prefix {layout.prefix}\n")
    if not result.steps:
        out.write("nothing to change\n")
    for line in step_lines(layout, result.steps, verbose):
        out.write(line + "\n")
    if result.steps:
        verb = "would change" if result.dry_run else "changed"
        out.write(f"{verb} {result.applied if not result.dry_run else len(result.steps)} of {len(result.steps)}\n")
    for loaded in result.verified:
        shown = loaded.version if loaded.version is not None else loaded.error
        out.write(f"verified {layout.rel(loaded.path)}: cudaRuntimeGetVersion = {shown}\n")
    for line in finding_lines(result.findings, verbose):
        out.write(line + "\n")
    if undo and result.ok and result.steps and not result.dry_run:
        out.write("restored the links recorded before fix-links\n")
