"""gptforge doctor: probe the live machine, judge it with the compatibility rules plus the checks
only a live machine allows, and report findings with a fix each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gptforge.compat import check
from gptforge.compat.findings import Finding, is_ok, report_json, unique
from gptforge.compat.wheels import installed_builds
from gptforge.doctor.checks import live_findings
from gptforge.probe import probe_machine
from gptforge.probe.machine import Machine


@dataclass
class DoctorReport:
    machine: Machine
    findings: list[Finding]

    def ok(self, strict: bool = False) -> bool:
        return is_ok(self.findings, strict)

    def exit_code(self, strict: bool = False) -> int:
        return 0 if self.ok(strict) else 1

    def to_json(self, strict: bool = False) -> dict:
        return report_json(self.findings, strict, machine=self.machine.to_json())


def rule_findings(machine: Machine) -> list[Finding]:
    """The compatibility engine's findings for the combination this machine holds, with the extension builds
    installed here (read from their metadata)."""
    return list(check(replace(machine.combination(), wheels=installed_builds() or None)))


def merge(*groups: list[Finding]) -> list[Finding]:
    """Each finding once, errors first, then warnings, then info."""
    return sorted(unique(f for group in groups for f in group), key=lambda f: f.rank)


def fp8_usable(machine: Machine, rules: list[Finding]) -> bool | None:
    """The engine's FP8 verdict for the GPUs present (CC >= 8.9, Ada with CUDA >= 12.1); None without a GPU."""
    if not machine.driver.gpus:
        return None
    return not any(f.code == "fp8-unavailable" for f in rules)


def run_doctor(env: dict | None = None) -> DoctorReport:
    machine = probe_machine(env)
    rules = rule_findings(machine)
    machine = replace(machine, transformer_engine=replace(machine.transformer_engine,
                                                          fp8_usable=fp8_usable(machine, rules)))
    return DoctorReport(machine, merge(rules, live_findings(machine)))
