"""CLI for `gptforge build apex` and `gptforge build deepspeed-ops` (argument parsing and output only)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from gptforge.cli import group
from gptforge.compat.findings import Finding, is_ok
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
                   "(default: $GPTFORGE_CACHE or ~/.cache/gptforge/wheels)")
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


def _toolchain(args):
    from gptforge.build.toolchain import probe_toolchain

    return probe_toolchain().as_if_torch_cuda(args.torch_cuda)


def _print_findings(findings: list[Finding]) -> None:
    for f in findings:
        line = f"{f.severity.value:7} [{f.code}] {f.message}"
        print(line + (f"\n        fix: {f.fix}" if f.fix else ""), file=sys.stderr)


def _verify(package: str, extra: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "gptforge.build.verify", package, *extra], capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "results": [{"check": "verification", "ok": False, "error": (out.stderr or out.stdout)[-400:]}]}


def _print_verify(report: dict) -> None:
    for r in report["results"]:
        detail = f" max|diff|={r['max_abs_diff']:.2e} (atol {r['atol']}, rtol {r['rtol']})" if "max_abs_diff" in r else ""
        err = f" {r['error']}" if r.get("error") else ""
        print(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['check']}{detail}{err}", file=sys.stderr)


def _finish(args, payload: dict, ok: bool) -> int:
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    return 0 if ok else 1


def _verify_only(args, package: str, extra: list[str]) -> int:
    report = _verify(package, extra)
    if not args.json:
        _print_verify(report)
    return _finish(args, {"ok": report["ok"], "verify": report}, report["ok"])


def _plan_or_findings(args, findings: list[Finding], make_plan):
    """The plan; when there is no arch to default to (no GPU...) but the toolchain already failed, report
    the toolchain first. A bad flag value is reported as such whatever the toolchain says."""
    from gptforge.build.apex import NoDefaultArch

    try:
        return make_plan(), None
    except NoDefaultArch:
        if is_ok(findings):
            raise
        if not args.json:
            _print_findings(findings)
        return None, _finish(args, {"ok": False, "findings": [f.to_json() for f in findings]}, False)


def _execute(args, findings: list[Finding], plan, text: str, build, package: str, verify_args: list[str]) -> int:
    """Shared tail of both commands: show, gate on the preflight, build or stop at the plan, verify."""
    payload = {"plan": plan.to_json(), "findings": [f.to_json() for f in findings]}
    if not args.json:
        print(text)
        _print_findings(findings)
    if not is_ok(findings):
        if not args.json:
            print("gptforge: preflight failed: fix the errors above, then re-run", file=sys.stderr)
        return _finish(args, {"ok": False, **payload}, False)
    if args.dry_run:
        return _finish(args, {"ok": True, **payload}, True)
    payload["result"] = build()
    ok = True
    if not (args.no_verify or args.no_install):
        payload["verify"] = report = _verify(package, verify_args)
        ok = report["ok"]
        if not args.json:
            _print_verify(report)
    return _finish(args, {"ok": ok, **payload}, ok)


def run_apex(args) -> int:
    from gptforge.build import apex, preflight
    from gptforge.build.pins import apex_pin

    modules = ",".join(apex_pin()["required_imports"])
    if args.verify_only:
        return _verify_only(args, "apex", ["--modules", modules])
    tc = _toolchain(args)
    findings = preflight.apex_findings(tc, args.ref) + preflight.transformer_engine_findings(tc)
    req = apex.ApexRequest(src=args.src, ref=args.ref, arch=args.arch, jobs=args.jobs, cache_root=args.cache,
                           force=args.force, all_contrib=args.all_contrib,
                           extensions=_extensions(args.extensions))
    planned, failed = _plan_or_findings(args, findings, lambda: apex.plan_apex(req, tc))
    if planned is None:
        return failed
    plan, src = planned
    return _execute(args, findings, plan, apex.plan_text(plan),
                    lambda: apex.build_and_install(plan, src, force=args.force, quiet=args.json, install=not args.no_install),
                    "apex", ["--modules", ",".join(plan.expected_extensions) or modules])


def run_deepspeed(args) -> int:
    from gptforge.build import deepspeed_ops, preflight

    ops = deepspeed_ops.parse_ops(args.ops)
    if args.verify_only:
        return _verify_only(args, "deepspeed", ["--ops", ",".join(ops)])
    tc = _toolchain(args)
    source = deepspeed_ops.resolve_source(args.src, args.ds_version)
    findings = preflight.deepspeed_findings(tc, source.version)
    plan, failed = _plan_or_findings(args, findings, lambda: deepspeed_ops.plan_deepspeed(
        ops, tc, source=source, arch=args.arch, jobs_n=args.jobs, cache_root=args.cache))
    if plan is None:
        return failed
    return _execute(args, findings, plan, deepspeed_ops.plan_text(plan),
                    lambda: deepspeed_ops.build_and_install(plan, force=args.force, quiet=args.json, install=not args.no_install),
                    "deepspeed", ["--ops", ",".join(ops)])
