"""Replay real users' reports (tests/data/compat_corpus.toml) through `gptforge compat check`.

Run as a script to print the score: python tests/compat_corpus.py; the 2026 corpus (tests/data/
compat_corpus_2026.toml), one part or all: python tests/compat_corpus.py dev
"""

from __future__ import annotations

import io
import json
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from gptforge.cli import main

CORPUS = Path(__file__).parent / "data" / "compat_corpus.toml"


def reports() -> list[dict]:
    return tomllib.loads(CORPUS.read_text(encoding="utf-8"))["report"]


@dataclass(frozen=True)
class Verdict:
    right: bool
    false_alarm: bool
    detail: str


def _check(args: list[str]) -> tuple[int, dict | None, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["compat", "check", *args, "--json"])
    except SystemExit as stop:
        code = int(stop.code or 0)
    text = out.getvalue()
    return code, (json.loads(text) if code in (0, 1) and text.strip() else None), err.getvalue().strip()


def judge(report: dict) -> Verdict:
    """Right: the error codes are exactly the expected ones and a fix names the move that worked."""
    code, result, stderr = _check(report["args"])
    if result is None:
        return Verdict(False, False, f"not expressible (exit {code}): {stderr}")
    errors = [f for f in result["findings"] if f["severity"] == "error"]
    codes = sorted({f["code"] for f in errors})
    expected = sorted(report["expect"])
    if not expected:
        return Verdict(not codes, bool(codes), f"errors {codes}" if codes else "silent")
    if codes != expected:
        return Verdict(False, False, f"errors {codes}, expected {expected}")
    wanted = report.get("fix")
    fixes = [f["fix"] for f in errors]
    if wanted and not any(wanted in fix for fix in fixes):
        return Verdict(False, False, f"fix {fixes} does not name {wanted!r}")
    return Verdict(True, False, "right")


def score() -> tuple[int, int, int, list[tuple[dict, Verdict]]]:
    judged = [(report, judge(report)) for report in reports()]
    right = sum(v.right for _, v in judged)
    alarms = sum(v.false_alarm for _, v in judged)
    return right, alarms, len(judged), judged


def _print_original() -> None:
    right, alarms, total, judged = score()
    for report, verdict in judged:
        if not verdict.right:
            print(f"WRONG {report['url']} {report['args']}: {verdict.detail}")
    print(f"{right}/{total} right ({100 * right / total:.0f}%), {alarms} false alarm(s)")


# --- the 2026 corpus: verdicts written from each report before the engine ran ----------------------------

CORPUS_2026 = Path(__file__).parent / "data" / "compat_corpus_2026.toml"
OUTCOMES = ("right", "missed", "false alarm", "inexpressible")


def reports_2026(part: str | None = None) -> list[dict]:
    rows = tomllib.loads(CORPUS_2026.read_text(encoding="utf-8"))["report"]
    return [r for r in rows if part is None or r["part"] == part]


def judge_2026(report: dict) -> tuple[str, str]:
    """(outcome, detail). Right: a "works" report gets no error; a "fails" report at least one error, among
    them every expected code ("new:<cause>" asks for any error). A false alarm is an error on a "works" report.
    Inexpressible: the report says its key fact has no flag, or the engine refuses its arguments (exit 2)."""
    code, result, stderr = _check(report["args"])
    if report.get("inexpressible"):
        return "inexpressible", report["inexpressible"]
    if result is None:
        return "inexpressible", f"exit {code}: {stderr}"
    codes = sorted({f["code"] for f in result["findings"] if f["severity"] == "error"})
    if report["verdict"] == "works":
        return ("false alarm", f"errors {codes}") if codes else ("right", "silent")
    wanted = sorted(c for c in report["expect"] if not c.startswith("new:"))
    if codes and set(wanted) <= set(codes):
        return "right", f"errors {codes}"
    return "missed", f"errors {codes}, expected {report['expect']}"


def score_2026(part: str | None = None) -> dict[str, list[tuple[dict, str]]]:
    outcomes: dict[str, list[tuple[dict, str]]] = {name: [] for name in OUTCOMES}
    for report in reports_2026(part):
        outcome, detail = judge_2026(report)
        outcomes[outcome].append((report, detail))
    return outcomes


def _print_2026(part: str | None) -> None:
    outcomes = score_2026(part)
    for name in ("missed", "false alarm", "inexpressible"):
        for report, detail in outcomes[name]:
            print(f"{name.upper()} {report['url']} {report['args']}: {detail}")
    expressible = len(outcomes["right"]) + len(outcomes["missed"]) + len(outcomes["false alarm"])
    share = f" ({100 * len(outcomes['right']) / expressible:.0f}% of {expressible} expressible)" if expressible else ""
    print(f"{part or 'all'}: " + ", ".join(f"{len(outcomes[n])} {n}" for n in OUTCOMES) + share)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:  # python tests/compat_corpus.py dev (or held-out, or all): the 2026 corpus
        _print_2026(None if sys.argv[1] == "all" else sys.argv[1])
    else:
        _print_original()
