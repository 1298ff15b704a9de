"""Replay real users' reports (tests/data/compat_corpus.toml) through `gptforge compat check`.

Run as a script to print the score: python tests/compat_corpus.py
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


if __name__ == "__main__":
    right, alarms, total, judged = score()
    for report, verdict in judged:
        if not verdict.right:
            print(f"WRONG {report['url']} {report['args']}: {verdict.detail}")
    print(f"{right}/{total} right ({100 * right / total:.0f}%), {alarms} false alarm(s)")
