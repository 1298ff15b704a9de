"""A finding: one thing a command has to say, with a stable code. compat's rules, doctor and fix-links report
problems as findings; train, and the sample, data and build commands, report their notes as findings too.

Codes are a public API (tests, docs and users' scripts match on them, and --json output carries them):
never rename one. A message is for people and may be reworded at any time.
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
