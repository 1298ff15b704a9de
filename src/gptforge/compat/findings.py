"""What the compatibility rules say about a combination: findings with stable codes.

Finding codes are a public API (tests, docs and users' scripts match on them): never rename one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


_RANK = {severity: rank for rank, severity in enumerate(Severity)}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    fix: str = ""

    def to_json(self) -> dict:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    @property
    def rank(self) -> int:
        """0 for an error, 1 for a warning, 2 for info: sort by it to list errors first."""
        return _RANK[self.severity]


def no_data(what: str, fix: str = "") -> Finding:
    """A check skipped for want of a fact: said, never a silent 'ok'."""
    return Finding("not-checked", Severity.INFO, f"not checked: no data for {what}", fix)


def is_ok(findings: list[Finding], strict: bool = False) -> bool:
    """No error (``strict``: no error and no warning)."""
    bad = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    return not any(f.severity in bad for f in findings)


def report_json(findings: list[Finding], strict: bool = False, **extra) -> dict:
    return {"ok": is_ok(findings, strict), "findings": [f.to_json() for f in findings], **extra}
