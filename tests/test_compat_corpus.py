"""The engine against real users' reports (tests/data/compat_corpus.toml), and the artifact-made tables."""

from __future__ import annotations

import pytest
from compat_corpus import judge, reports, score

from compatgen import refresh


@pytest.mark.parametrize("report", reports(), ids=lambda r: f"{r['url'].split('github.com/')[-1]}:{' '.join(r['args'])}")
def test_report_is_judged_right(report):
    verdict = judge(report)
    assert verdict.right, verdict.detail


def test_corpus_is_large_sourced_and_has_both_kinds():
    rows = reports()
    assert len(rows) >= 40
    assert all(r["url"].startswith("https://github.com/") and r["args"] and r["saw"] for r in rows)
    assert sum(not r["expect"] for r in rows) >= 10, "working combinations guard against false alarms"


def test_score_is_at_least_90_percent_with_no_false_alarm():
    right, alarms, total, _ = score()
    assert alarms == 0
    assert right / total >= 0.9


def test_python_table_equals_the_refresh_output_of_its_recorded_input():
    """data/torch_python.toml is what `python tasks/compat_refresh.py` makes from the recorded PyPI listing."""
    assert refresh.OUTPUT.read_text(encoding="utf-8") == refresh.python_table(refresh.recorded_filenames())


def test_python_table_reads_the_wheel_tags():
    table = refresh.python_table(["torch-2.2.0-cp312-cp312-manylinux1_x86_64.whl",
                                  "torch-2.2.0-cp312-none-macosx_11_0_arm64.whl",
                                  "torch-2.2.0-cp38-cp38-manylinux1_x86_64.whl",
                                  "torch-2.9.0-cp313-cp313t-manylinux_2_28_x86_64.whl",
                                  "torch-2.2.0.tar.gz"])
    assert 'version = "2.2.0"\npython = ["3.8", "3.12"]' in table
    assert "2.9.0" not in table  # free-threaded only


def test_the_2026_corpus_states_each_report_fully():
    from compat_corpus import reports_2026

    rows = reports_2026()
    assert len(rows) >= 40
    for row in rows:
        assert row["url"].startswith("https://") and row["args"] and row["saw"] and row["cause"], row["url"]
        assert row["verdict"] in ("fails", "works") and row["part"] in ("dev", *FIRST_SCORES), row["url"]
        assert (row["verdict"] == "works") == (not row["expect"]), row["url"]


def test_the_2026_dev_part_is_at_least_90_percent_right_with_no_false_alarm():
    from compat_corpus import score_2026

    outcomes = score_2026("dev")
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]
    expressible = len(outcomes["right"]) + len(outcomes["missed"])
    assert len(outcomes["right"]) / expressible >= 0.9


# Each held-out part as it was scored, once: (right, missed, false alarms, inexpressible). A part was gathered
# blind, by someone who saw only the command's --help and the corpus format, after the part before it was
# scored. Its first score is a regression floor, never a target to fit.
FIRST_SCORES = {
    "held-out": (17, 2, 0, 4),
    "held-out-2": (21, 5, 1, 1),
    "held-out-3": (17, 6, 0, 7),
    "held-out-4": (18, 4, 0, 8),
    "held-out-5": (19, 10, 1, 0),  # the false alarm: a torch 2.3 flash-attn wheel its report says ran on torch 2.4.1
    "held-out-6": (18, 4, 1, 9),  # the false alarm: torch 1.7.0 without its CUDA on an RTX 3090, which ran
    "held-out-7": (17, 4, 0, 15),
    "held-out-8": (12, 2, 0, 6),
    "held-out-9": (28, 2, 1, 1),  # the false alarm: a Maxwell "TITAN X" taken for the Pascal one (sm_61)
    "held-out-10": (19, 4, 0, 9),
    "held-out-11": (30, 1, 0, 3),
}


@pytest.mark.parametrize("part", FIRST_SCORES)
def test_a_held_out_part_keeps_its_first_score(part):
    from compat_corpus import score_2026

    right, _, false_alarms, _ = FIRST_SCORES[part]
    outcomes = score_2026(part)
    assert len(outcomes["right"]) >= right
    assert len(outcomes["false alarm"]) <= false_alarms, [r["url"] for r, _ in outcomes["false alarm"]]
