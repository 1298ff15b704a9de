"""CLI for `gptforge build helpers|apex|deepspeed-ops` (argument parsing and output only; the build itself is
gptforge.build.pipeline and gptforge.build.helpers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptforge.build.pipeline import BuildOptions, Outcome, Show, build_apex, build_deepspeed
from gptforge.cli import group
from gptforge.compat.findings import Finding
from gptforge.errors import UsageError

EPILOG_APEX = """\
By default builds apex's core extensions (--cpp_ext --cuda_ext: apex_C, amp_C, fused_layer_norm_cuda, ...)
for the GPUs present, with extensions compiled in parallel, into a wheel cache shared by every process
and node that points at the same --cache; the next build with the same inputs installs from the cache
in seconds. The build log path is printed before compiling (it survives a closed terminal).
Exit status: 0 built/installed and verified, 1 a preflight finding or a failed build/verification, 2 bad usage.
"""


def register(subparsers, groups) -> None:
    builds = group(subparsers, groups, "build", "Compile native components")
    helpers = builds.add_parser("helpers", help="compile the dataset helpers (C++) for this Python",
                                description="Compile gptforge/data/helpers.cpp with g++ and pybind11 for the running "
                                            "interpreter into a cache keyed by source hash and ABI; a second run "
                                            "finds it there and compiles nothing.")
    helpers.add_argument("--force", action="store_true", help="compile even when the cache has it")
    helpers.add_argument("--json", action="store_true", help="print one JSON object")
    helpers.set_defaults(func=run_build_helpers)
    apex = builds.add_parser("apex", help="build NVIDIA apex (pinned commit) into a shared wheel cache and install it",
                             description="Build NVIDIA apex's CUDA extensions once per toolchain, cache and install the wheel.",
                             epilog=EPILOG_APEX, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = apex.add_mutually_exclusive_group()
    source.add_argument("--src", type=Path, metavar="DIR", help="an apex source tree (default: git clone of the pinned commit)")
    source.add_argument("--ref", metavar="COMMIT", help="build this apex commit instead of the pinned one (git clone)")
    apex.add_argument("--all-contrib", action="store_true", help="also build every apex.contrib extension (slow)")
    apex.add_argument("--extensions", metavar="A,B", help="build only these extension modules, e.g. "
                      "apex_C,amp_C,fused_layer_norm_cuda (default: all that the flags declare)")
    _common(apex)
    apex.add_argument("--verify-only", action="store_true",
                      help="only check the installed apex: extensions import, FusedAdam/FusedLayerNorm match torch")
    apex.add_argument("--no-verify", action="store_true", help="skip the numeric checks after installing")
    apex.set_defaults(func=run_apex)

    ds = builds.add_parser("deepspeed-ops", help="build a DeepSpeed wheel with ops precompiled (DS_BUILD_<OP>=1)",
                           description="Precompile DeepSpeed ops into a cached wheel and install it, after the build preflight.")
    ds.add_argument("--ops", default=None, help="comma-separated ops (default: fused_adam,cpu_adam)")
    ds.add_argument("--src", type=Path, metavar="PATH", help="a DeepSpeed sdist (.tar.gz) or source tree (default: pip fetches it)")
    ds.add_argument("--version", dest="ds_version", metavar="X.Y.Z", help="DeepSpeed version to fetch (default: the installed one)")
    _common(ds)
    ds.add_argument("--verify-only", action="store_true", help="only check the installed DeepSpeed ops: prebuilt and numerically right")
    ds.add_argument("--no-verify", action="store_true", help="skip the checks after installing")
    ds.set_defaults(func=run_deepspeed)


def _common(p) -> None:
    p.add_argument("--arch", metavar="LIST", help="TORCH_CUDA_ARCH_LIST to build for, e.g. '9.0' or '8.0;9.0' "
                   "(default: the GPUs present that nvcc can target)")
    p.add_argument("--jobs", type=_positive, metavar="N", help="compiler processes at once (default: from cores and free memory)")
    p.add_argument("--cache", type=Path, metavar="DIR", help="wheel cache, may be shared by nodes "
                   "(default: $GPTFORGE_CACHE/wheels, else ~/.cache/gptforge/wheels)")
    p.add_argument("--force", action="store_true", help="rebuild even when the cache has this wheel")
    p.add_argument("--no-install", action="store_true", help="only make sure the cache holds the wheel (e.g. on a "
                   "build node filling a shared cache); implies --no-verify")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the preflight, build nothing")
    p.add_argument("--torch-cuda", metavar="X.Y", help="judge and plan as if torch were built with this CUDA "
                   "(what-if for a torch not installed yet)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _extensions(text: str | None) -> tuple[str, ...]:
    names = tuple(e.strip() for e in (text or "").split(",") if e.strip())
    if text is not None and not names:
        raise UsageError("--extensions", f"{text!r} names no extension", "e.g. --extensions apex_C,amp_C,fused_layer_norm_cuda")
    return names


class _Printed(Show):
    """The progress of a build as text: the plan on stdout, findings and checks on stderr."""

    def plan(self, text: str) -> None:
        print(text)

    def findings(self, findings: list[Finding]) -> None:
        for f in findings:
            line = f"{f.severity.value:7} [{f.code}] {f.message}"
            print(line + (f"\n        fix: {f.fix}" if f.fix else ""), file=sys.stderr)

    def preflight_failed(self) -> None:
        print("gptforge: preflight failed: fix the errors above, then re-run", file=sys.stderr)

    def verify(self, report: dict) -> None:
        for r in report["results"]:
            detail = f" max|diff|={r['max_abs_diff']:.2e} (atol {r['atol']}, rtol {r['rtol']})" if "max_abs_diff" in r else ""
            err = f" {r['error']}" if r.get("error") else ""
            print(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['check']}{detail}{err}", file=sys.stderr)


def _options(args) -> BuildOptions:
    return BuildOptions(arch=args.arch, jobs=args.jobs, cache=args.cache, force=args.force, no_install=args.no_install,
                        no_verify=args.no_verify, dry_run=args.dry_run, torch_cuda=args.torch_cuda, quiet=args.json)


def _finish(args, outcome: Outcome) -> int:
    if args.json:
        print(json.dumps(outcome.report, indent=2, default=str))
    return 0 if outcome.ok else 1


def run_apex(args) -> int:
    extensions = () if args.verify_only else _extensions(args.extensions)
    return _finish(args, build_apex(_options(args), Show() if args.json else _Printed(), src=args.src, ref=args.ref,
                                    all_contrib=args.all_contrib, extensions=extensions, verify=args.verify_only))


def run_deepspeed(args) -> int:
    return _finish(args, build_deepspeed(_options(args), Show() if args.json else _Printed(), ops=args.ops,
                                         src=args.src, version=args.ds_version, verify=args.verify_only))


def run_build_helpers(args) -> int:
    from gptforge.build.helpers import build_helpers

    result = build_helpers(force=args.force)
    report = {"path": str(result.path), "key": result.key, "built": result.built, "seconds": round(result.seconds, 3),
              "command": result.command}
    if args.json:
        print(json.dumps(report, indent=2))
    elif result.built:
        print(f"compiled dataset helpers in {result.seconds:.1f} s: {result.path}")
    else:
        print(f"dataset helpers already built for this Python: {result.path}")
    return 0
