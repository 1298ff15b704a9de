"""Group a plan for reading: a repair can link a hundred headers, one line each is unreadable.

By default a kind of change (or a finding code) with more than ``SHOWN`` entries is one line with
counts; ``--verbose`` lists every entry, and ``--json`` always keeps full detail.
"""

from __future__ import annotations

import os
from collections import Counter

from gptforge.compat.findings import Finding
from gptforge.links.layout import Layout
from gptforge.links.plan import Step

SHOWN = 3
KINDS = ("temporary link", "lib64", "library", "header")


def step_kind(layout: Layout, step: Step) -> str:
    if step.action == "remove-tmp":
        return "temporary link"
    if step.path == layout.lib64:
        return "lib64"
    if step.path == layout.include or os.path.dirname(step.path) == layout.include:
        return "header"
    return "library"


def step_line(layout: Layout, step: Step) -> str:
    if step.action == "remove-tmp" or step.target is None:
        return f"  remove link {layout.rel(step.path)}  ({step.reason})"
    return f"  link {layout.rel(step.path)} -> {step.target}  (was: {_before(step)}; {step.reason})"


def step_lines(layout: Layout, steps: list[Step], verbose: bool) -> list[str]:
    by_kind: dict[str, list[Step]] = {k: [] for k in KINDS}
    for step in steps:
        by_kind[step_kind(layout, step)].append(step)
    lines = []
    for kind, group in by_kind.items():
        if verbose or len(group) <= SHOWN:
            lines += [step_line(layout, s) for s in group]
            continue
        was = Counter(_before_kind(s) for s in group)
        dirs = sorted({layout.rel(os.path.dirname(s.path)) for s in group})
        lines.append(f"  {kind}: {len(group)} links in {', '.join(dirs)} (was: "
                     + ", ".join(f"{n} {what}" for what, n in sorted(was.items())) + "; --verbose lists them)")
    return lines


def finding_lines(findings: list[Finding], verbose: bool) -> list[str]:
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    lines = []
    for group in by_code.values():
        shown = group if verbose or len(group) <= SHOWN else group[:1]
        for f in shown:
            fix = f"  -> {f.fix}" if f.fix else ""
            lines.append(f"{f.severity.value}: {f.code}: {f.message}{fix}")
        if len(shown) < len(group):
            lines.append(f"{group[0].severity.value}: {group[0].code}: and {len(group) - 1} more like it "
                         "(--verbose lists them)")
    return lines


def _before(step: Step) -> str:
    return step.before.target if step.before.kind == "link" else step.before.kind


def _before_kind(step: Step) -> str:
    if step.before.kind == "link":
        return "link elsewhere" if step.before.real else "dangling link"
    return step.before.kind
