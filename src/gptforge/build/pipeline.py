"""`gptforge build apex|deepspeed-ops` from end to end: probe, preflight, plan, build (or stop at the plan),
install, verify. What a person sees on the way goes through ``Show``; the result is the ``--json`` report."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gptforge.compat.findings import Finding, is_ok


@dataclass(frozen=True)
class BuildOptions:
    arch: str | None = None
    jobs: int | None = None
    cache: Path | None = None
    force: bool = False
    no_install: bool = False  # implies no verification
    no_verify: bool = False
    dry_run: bool = False
    torch_cuda: str | None = None  # judge and plan as if torch were built with this CUDA
    quiet: bool = False  # the compiler's output goes to the build log only


class Show:
    """The progress a person sees while a build runs (the CLI prints it); this one shows nothing, as with
    --json, where only the final report is printed."""

    def plan(self, text: str) -> None:
        pass

    def findings(self, findings: list[Finding]) -> None:
        pass

    def preflight_failed(self) -> None:
        pass

    def verify(self, report: dict) -> None:
        pass


@dataclass(frozen=True)
class Outcome:
    ok: bool
    report: dict  # what --json prints


def verify_installed(package: str, extra: list[str]) -> dict:
    """gptforge.build.verify in a fresh interpreter, so that it sees the wheel just installed."""
    out = subprocess.run([sys.executable, "-m", "gptforge.build.verify", package, *extra], capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "results": [{"check": "verification", "ok": False, "error": (out.stderr or out.stdout)[-400:]}]}


def verify_only(package: str, extra: list[str], show: Show) -> Outcome:
    report = verify_installed(package, extra)
    show.verify(report)
    return Outcome(report["ok"], {"ok": report["ok"], "verify": report})


def _machine(opts: BuildOptions):
    from gptforge.build.toolchain import Toolchain, as_if_torch_cuda
    from gptforge.probe import probe_machine

    machine = as_if_torch_cuda(probe_machine(), opts.torch_cuda)
    return machine, Toolchain.of(machine)


def _plan_or_findings(findings: list[Finding], make_plan: Callable, show: Show):
    """The plan; when there is no arch to default to (no GPU...) but the toolchain already failed, report
    the toolchain first. A bad flag value is reported as such whatever the toolchain says."""
    from gptforge.build.apex import NoDefaultArch

    try:
        return make_plan(), None
    except NoDefaultArch:
        if is_ok(findings):
            raise
        show.findings(findings)
        return None, Outcome(False, {"ok": False, "findings": [f.to_json() for f in findings]})


def _execute(opts: BuildOptions, findings: list[Finding], plan, text: str, build: Callable[[], dict], package: str,
             verify_args: list[str], show: Show) -> Outcome:
    """Shared tail of both builds: show, gate on the preflight, build or stop at the plan, verify."""
    report = {"plan": plan.to_json(), "findings": [f.to_json() for f in findings]}
    show.plan(text)
    show.findings(findings)
    if not is_ok(findings):
        show.preflight_failed()
        return Outcome(False, {"ok": False, **report})
    if opts.dry_run:
        return Outcome(True, {"ok": True, **report})
    report["result"] = build()
    ok = True
    if not (opts.no_verify or opts.no_install):
        report["verify"] = checked = verify_installed(package, verify_args)
        ok = checked["ok"]
        show.verify(checked)
    return Outcome(ok, {"ok": ok, **report})


def build_apex(opts: BuildOptions, show: Show, *, src: Path | None = None, ref: str | None = None,
               all_contrib: bool = False, extensions: tuple[str, ...] = (), verify: bool = False) -> Outcome:
    """``verify``: only check the apex installed now."""
    from gptforge.build import apex, preflight
    from gptforge.build.source import apex_pin

    modules = ",".join(apex_pin()["required_imports"])
    if verify:
        return verify_only("apex", ["--modules", modules], show)
    machine, tc = _machine(opts)
    findings = preflight.apex_findings(machine, ref) + preflight.transformer_engine_findings(machine)
    req = apex.ApexRequest(src=src, ref=ref, arch=opts.arch, jobs=opts.jobs, cache_root=opts.cache,
                           all_contrib=all_contrib, extensions=extensions)
    planned, failed = _plan_or_findings(findings, lambda: apex.plan_apex(req, tc), show)
    if planned is None:
        return failed
    plan, source = planned
    return _execute(opts, findings, plan, apex.plan_text(plan),
                    lambda: apex.build_and_install(plan, source, force=opts.force, quiet=opts.quiet,
                                                   install=not opts.no_install),
                    "apex", ["--modules", ",".join(plan.expected_extensions) or modules], show)


def build_deepspeed(opts: BuildOptions, show: Show, *, ops: str | None = None, src: Path | None = None,
                    version: str | None = None, verify: bool = False) -> Outcome:
    """``ops``: comma-separated op names (None: the pinned defaults); ``verify``: only check those installed now."""
    from gptforge.build import deepspeed_ops, preflight

    names = deepspeed_ops.parse_ops(ops)
    if verify:
        return verify_only("deepspeed", ["--ops", ",".join(names)], show)
    machine, tc = _machine(opts)
    source = deepspeed_ops.resolve_source(src, version)
    findings = preflight.deepspeed_findings(machine, source.version)
    plan, failed = _plan_or_findings(findings, lambda: deepspeed_ops.plan_deepspeed(
        names, tc, source=source, arch=opts.arch, jobs_n=opts.jobs, cache_root=opts.cache), show)
    if plan is None:
        return failed
    return _execute(opts, findings, plan, deepspeed_ops.plan_text(plan),
                    lambda: deepspeed_ops.build_and_install(plan, force=opts.force, quiet=opts.quiet,
                                                            install=not opts.no_install),
                    "deepspeed", ["--ops", ",".join(names)], show)
