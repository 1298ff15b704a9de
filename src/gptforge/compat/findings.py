"""What the compatibility rules say about a combination: findings with stable codes.

Finding codes are a public API (tests, docs and users' scripts match on them): never rename one.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def unique(findings: Iterable[Finding]) -> list[Finding]:
    """Each finding once, in first-seen order. Two findings are the same only when every field is: one code
    may carry two problems (gcc and nvcc both too old for torch's C++ standard), and each must be shown."""
    return list(dict.fromkeys(findings))


def is_ok(findings: list[Finding], strict: bool = False) -> bool:
    """No error (``strict``: no error and no warning)."""
    bad = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    return not any(f.severity in bad for f in findings)


def report_json(findings: list[Finding], strict: bool = False, **extra) -> dict:
    return {"ok": is_ok(findings, strict), "findings": [f.to_json() for f in findings], **extra}
