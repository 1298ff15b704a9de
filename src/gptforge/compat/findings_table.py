"""Findings as a rich table, for the commands that print them to people (compat check, doctor)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from gptforge.compat.findings import Finding, Severity

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def findings_table(findings: list[Finding], title: str) -> Table:
    """One row per finding. Cells are plain Text: messages quote paths and versions that may hold '[' (rich markup)."""
    table = Table(title=title, title_justify="left", show_lines=True)
    for column in ("severity", "code", "problem", "fix"):
        table.add_column(column, overflow="fold")
    for finding in findings:
        severity = Text(finding.severity.value, style=_STYLE[finding.severity])
        table.add_row(severity, Text(finding.code), Text(finding.message), Text(finding.fix or "-"))
    return table
