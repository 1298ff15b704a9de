"""``fix-links --undo``: put back every recorded path as it was before the first change."""

from __future__ import annotations

import os

from gptforge.compat.findings import Finding, Severity
from gptforge.links import scan
from gptforge.links.apply import problems_before_change, remove_link, replace_link
from gptforge.links.layout import Layout
from gptforge.links.plan import Step, stale_temp_steps
from gptforge.links.record import UndoRecord


def undo_steps(layout: Layout, record: UndoRecord) -> tuple[list[Step], list[Finding]]:
    """The changes that restore the recorded states (most recent first), and what blocks any."""
    steps = stale_temp_steps(layout)
    findings: list[Finding] = []
    for item in reversed(record.entries):
        path = os.path.join(layout.prefix, item["path"])
        before, now = item["before"], scan.entry(path)
        after = item.get("after")
        if after is None and now.to_json() != before:  # no proof that fix-links made what is there now
            findings.append(Finding("links-undo-conflict", Severity.ERROR,
                                    f"{item['path']}: the record does not say what fix-links left there (no \"after\"), "
                                    f"and it is now {_shown(now.to_json())}; nothing was restored",
                                    f"if fix-links made it, put back {_shown(before)} by hand; then rerun --undo"))
            continue
        if after is not None and now.to_json() != after and now.to_json() != before:
            findings.append(Finding("links-undo-conflict", Severity.ERROR,
                                    f"{item['path']} changed since fix-links ({_shown(now.to_json())}, fix-links left "
                                    f"{_shown(after)}); nothing was restored", "restore it by hand, then rerun --undo"))
            continue
        if before["kind"] == "absent" and now.kind == "absent":
            continue
        if before["kind"] == "link" and now.kind == "link" and now.target == before["target"]:
            continue
        if now.kind not in ("absent", "link"):
            findings.append(Finding("links-undo-conflict", Severity.ERROR,
                                    f"{item['path']} is now a {now.kind}; not restored",
                                    "move it aside yourself and rerun --undo"))
        elif before["kind"] == "absent":
            steps.append(Step("remove-link", path, None, now, "was absent before fix-links"))
        else:
            steps.append(Step("link", path, before["target"], now, "link as it was before fix-links"))
    return steps, findings


def run_undo_steps(layout: Layout, record: UndoRecord, steps: list[Step]) -> list[Finding]:
    problems = problems_before_change(layout, steps, os.path.dirname(layout.undo_path))
    if problems:
        return problems
    record.save("undoing")
    for step in steps:
        if step.action == "link":
            replace_link(step.path, step.target)
        else:
            remove_link(step.path)
    record.delete()
    return []


def _shown(state: dict) -> str:
    return f"a link to {state['target']}" if state["kind"] == "link" else state["kind"]
