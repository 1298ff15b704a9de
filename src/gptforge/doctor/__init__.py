"""gptforge doctor: probe the live machine, judge it with the compatibility rules plus the checks
only a live machine allows, and report findings with a fix each.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptforge.compat import check
from gptforge.compat.findings import Finding, is_ok, report_json
from gptforge.doctor.checks import live_findings
from gptforge.doctor.combination import combination_from_machine
from gptforge.probe import probe_machine


@dataclass
class DoctorReport:
    machine: dict
    findings: list[Finding]

    def ok(self, strict: bool = False) -> bool:
        return is_ok(self.findings, strict)

    def exit_code(self, strict: bool = False) -> int:
        return 0 if self.ok(strict) else 1

    def to_json(self, strict: bool = False) -> dict:
        return report_json(self.findings, strict, machine=self.machine)


def rule_findings(machine: dict) -> list[Finding]:
    """The compatibility engine's findings for the combination this machine holds."""
    return list(check(combination_from_machine(machine)))


def merge(*groups: list[Finding]) -> list[Finding]:
    """One finding per (code, message), errors first, then warnings, then info."""
    seen, merged = set(), []
    for finding in (f for group in groups for f in group):
        if (finding.code, finding.message) not in seen:
            seen.add((finding.code, finding.message))
            merged.append(finding)
    return sorted(merged, key=lambda f: f.rank)


def fp8_usable(machine: dict, rules: list[Finding]) -> bool | None:
    """The engine's FP8 verdict for the GPUs present (CC >= 8.9, Ada with CUDA >= 12.1); None without a GPU."""
    if not machine["driver"]["gpus"]:
        return None
    return not any(f.code == "fp8-unavailable" for f in rules)


def run_doctor(env: dict | None = None) -> DoctorReport:
    machine = probe_machine(env)
    rules = rule_findings(machine)
    machine["transformer_engine"]["fp8_usable"] = fp8_usable(machine, rules)
    return DoctorReport(machine, merge(rules, live_findings(machine)))
