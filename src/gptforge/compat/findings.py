"""What the compatibility rules say about a combination: findings with stable codes (core/findings.py), as JSON
or as a table for people (compat check, doctor).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gptforge.core.findings import Finding, Severity

if TYPE_CHECKING:
    from rich.table import Table

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def no_data(what: str, fix: str = "") -> Finding:
    """A check skipped for want of a fact: said, never a silent 'ok'."""
    return Finding("not-checked", Severity.INFO, f"not checked: no data for {what}", fix)


def unique(findings: Iterable[Finding]) -> list[Finding]:
    """Each finding once, in first-seen order. Two findings are the same only when every field is: one code
    may carry two problems (gcc and nvcc both too old for torch's C++ standard), and each must be shown."""
    return list(dict.fromkeys(findings))


def in_order(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; by code and message within each."""
    return sorted(findings, key=lambda f: (f.rank, f.code, f.message))


def is_ok(findings: list[Finding], strict: bool = False) -> bool:
    """No error (``strict``: no error and no warning)."""
    bad = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    return not any(f.severity in bad for f in findings)


def report_json(findings: list[Finding], strict: bool = False, **extra) -> dict:
    return {"ok": is_ok(findings, strict), "findings": [f.to_json() for f in findings], **extra}


def findings_table(findings: list[Finding], title: str) -> Table:
    """One row per finding. Cells are plain Text: messages quote paths and versions that may hold '[' (rich markup)."""
    from rich.table import Table  # imported here: every command imports this module, few print a table
    from rich.text import Text

    table = Table(title=title, title_justify="left", show_lines=True)
    for column in ("severity", "code", "problem", "fix"):
        table.add_column(column, overflow="fold")
    for finding in findings:
        severity = Text(finding.severity.value, style=_STYLE[finding.severity])
        table.add_row(severity, Text(finding.code), Text(finding.message), Text(finding.fix or "-"))
    return table
