"""The engine against real users' reports (tests/data/compat_corpus.toml), and the artifact-made tables."""

from __future__ import annotations

import pytest
from compat_corpus import judge, reports, score

from gptforge.compat import refresh


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
    """data/torch_python.toml is what `python -m gptforge.compat.refresh` makes from the recorded PyPI listing."""
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
        assert row["verdict"] in ("fails", "works") and row["part"] in ("dev", "held-out", "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6", "held-out-7", "held-out-8"), row["url"]
        assert (row["verdict"] == "works") == (not row["expect"]), row["url"]


def test_the_2026_dev_part_is_at_least_90_percent_right_with_no_false_alarm():
    from compat_corpus import score_2026

    outcomes = score_2026("dev")
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]
    expressible = len(outcomes["right"]) + len(outcomes["missed"])
    assert len(outcomes["right"]) / expressible >= 0.9


def test_the_2026_held_out_part_keeps_its_first_score_and_raises_no_false_alarm():
    # Scored once, after the engine's work on the dev part was done; a regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out")
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]
    assert len(outcomes["right"]) >= 17


def test_the_2026_second_held_out_part_keeps_its_first_score():
    # Gathered blind after the first held-out part was spent and scored once: 21 right, 5 missed, 1 false
    # alarm, 1 inexpressible. A regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-2")
    assert len(outcomes["right"]) >= 21
    assert len(outcomes["false alarm"]) <= 1


def test_the_2026_third_held_out_part_keeps_its_first_score():
    # Gathered blind after the second held-out part was spent, by someone who saw only the command's --help
    # and the corpus format; scored once: 17 right, 6 missed, 0 false alarms, 7 inexpressible. A regression
    # floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-3")
    assert len(outcomes["right"]) >= 17
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]


def test_the_2026_fourth_held_out_part_keeps_its_first_score():
    # Gathered blind after the third held-out part was spent, by someone who saw only the command's --help and
    # the corpus format; scored once: 18 right, 4 missed, 0 false alarms, 8 inexpressible. A regression floor,
    # never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-4")
    assert len(outcomes["right"]) >= 18
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]


def test_the_2026_fifth_held_out_part_keeps_its_first_score():
    # Gathered blind after the fourth held-out part was spent, as that one was; scored once: 19 right, 10 missed,
    # 1 false alarm (a torch 2.3 flash-attn wheel its report says ran on torch 2.4.1), 0 inexpressible. A
    # regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-5")
    assert len(outcomes["right"]) >= 19
    assert len(outcomes["false alarm"]) <= 1, [r["url"] for r, _ in outcomes["false alarm"]]


def test_the_2026_sixth_held_out_part_keeps_its_first_score():
    # Gathered blind after the fifth held-out part was spent, as that one was; scored once: 18 right, 4 missed,
    # 1 false alarm (an RTX 3090 on torch 1.7.0 given without its CUDA, which its report says ran), 9
    # inexpressible. A regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-6")
    assert len(outcomes["right"]) >= 18
    assert len(outcomes["false alarm"]) <= 1, [r["url"] for r, _ in outcomes["false alarm"]]


def test_the_2026_seventh_held_out_part_keeps_its_first_score():
    # Gathered blind after the sixth held-out part was spent, as that one was; scored once: 17 right, 4 missed,
    # 0 false alarms, 15 inexpressible. A regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-7")
    assert len(outcomes["right"]) >= 17
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]


def test_the_2026_eighth_held_out_part_keeps_its_first_score():
    # Gathered blind after the seventh held-out part was spent, as that one was; scored once: 12 right, 2 missed,
    # 0 false alarms, 6 inexpressible. A regression floor, never a target to fit.
    from compat_corpus import score_2026

    outcomes = score_2026("held-out-8")
    assert len(outcomes["right"]) >= 12
    assert not outcomes["false alarm"], [r["url"] for r, _ in outcomes["false alarm"]]
