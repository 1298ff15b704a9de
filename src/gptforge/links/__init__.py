"""CUDA library layout repair for conda/pixi prefixes (``gptforge fix-links``).

``fix(prefix, cuda)`` plans, applies and verifies; ``undo(prefix)`` restores what the undo record
says. Both return a ``Result``; nothing here prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gptforge.compat.findings import Finding, Severity, is_ok
from gptforge.core.versions import CudaVersion
from gptforge.links.apply import apply_steps, problems_before_change
from gptforge.links.families import Version
from gptforge.links.layout import Layout
from gptforge.links.libversion import Loaded, load_versions
from gptforge.links.plan import Plan, Step, make_plan
from gptforge.links.record import UndoRecord
from gptforge.links.undo import run_undo_steps, undo_steps

__all__ = ["Result", "fix", "undo", "make_plan", "Layout"]


@dataclass
class Result:
    layout: Layout
    cuda: Version | None
    steps: list[Step]
    applied: int = 0
    findings: list[Finding] = field(default_factory=list)
    chosen: dict = field(default_factory=dict)
    verified: list[Loaded] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return is_ok(self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def fix(prefix: str, cuda: Version, *, source: str | None = None, dry_run: bool = False,
        verify: bool = True) -> Result:
    layout = Layout.of(prefix)
    plan = make_plan(layout, cuda, source)
    result = Result(layout, cuda, plan.steps, findings=list(plan.findings), chosen=plan.chosen, dry_run=dry_run)
    if dry_run:
        return result
    if plan.steps:
        blockers = problems_before_change(layout, plan.steps, os.path.dirname(layout.undo_path))
        if blockers:
            result.findings += blockers
            return result
        result.applied = apply_steps(layout, plan.steps)
    if verify:
        _verify(plan, result)
    return result


def _verify(plan: Plan, result: Result) -> None:
    chosen = plan.chosen.get("libcudart")
    if chosen is None:
        return
    names = ["libcudart.so", chosen.soname]
    paths = [os.path.join(plan.layout.lib, n) for n in names if os.path.lexists(os.path.join(plan.layout.lib, n))]
    result.verified = load_versions(paths)
    want = CudaVersion(*plan.cuda[:2]).encoded
    for loaded in result.verified:
        if loaded.version != want:
            got = loaded.error or f"cudaRuntimeGetVersion() = {loaded.version}"
            result.findings.append(Finding(
                "links-verify-failed", Severity.ERROR,
                f"{plan.layout.rel(loaded.path)} loads a runtime that is not CUDA {plan.cuda[0]}.{plan.cuda[1]} "
                f"(expected {want}; {got})",
                "the real file's name does not tell its version; reinstall cuda-cudart for this CUDA"))


def undo(prefix: str, *, dry_run: bool = False) -> Result:
    layout = Layout.of(prefix)
    record = UndoRecord.load(layout)
    if record is None:
        return Result(layout, None, [], findings=[Finding("links-nothing-to-undo", Severity.INFO,
                                                          f"no undo record in {layout.prefix}; nothing to undo")])
    steps, findings = undo_steps(layout, record)
    result = Result(layout, None, steps, findings=findings, dry_run=dry_run)
    if findings or dry_run:
        return result
    result.findings += run_undo_steps(layout, record, steps)
    result.applied = 0 if result.findings else len(steps)
    return result
