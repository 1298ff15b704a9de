"""TransformerEngine against the flash-attn installed beside it: the range each release's attention accepts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptforge.compat import Combination, check
from gptforge.compat.facts import facts

ROWS = facts().extensions["transformer_engine"]["flash_attn"]
FLASH_RELEASES = ["1.0.9", "2.0.4", "2.0.6", "2.1.1", "2.3.6", "2.5.8", "2.5.9.post1", "2.6.3", "2.7.0",
                  "2.7.3", "2.7.4.post1", "2.8.0.post2", "2.8.1", "2.8.3", "2.8.3.post1"]


def found(**fields) -> dict[str, str]:
    """te-flash-attn-version's severity (absent when the rule is silent)."""
    return {f.code: f.severity.value for f in check(Combination(**fields)) if f.code == "te-flash-attn-version"}


def a_release_of(row: dict) -> str:
    """The first minor release the row's specifier holds."""
    low = Version(next(s.version for s in SpecifierSet(row["versions"]) if s.operator == ">="))
    return f"{low.major}.{low.minor}"


def test_releases_that_assert_fail_outside_their_range():
    assert found(transformer_engine="1.10", flash_attn="2.6.3") == {"te-flash-attn-version": "error"}
    assert found(transformer_engine="1.11", flash_attn="2.6.3") == {}
    assert found(transformer_engine="1.4", flash_attn="2.0.4", ccs=((9, 0),)) == {"te-flash-attn-version": "error"}


def test_releases_that_build_flash_attention_only_on_ampere_stay_silent_below():
    assert found(transformer_engine="1.7", flash_attn="2.6.3", ccs=((7, 0),)) == {}
    assert found(transformer_engine="1.7", flash_attn="2.6.3", ccs=((8, 0),)) == {"te-flash-attn-version": "error"}
    assert found(transformer_engine="1.10", flash_attn="2.6.3", ccs=((7, 0),)) == {"te-flash-attn-version": "error"}


def test_newer_releases_fall_back_with_a_warning():
    assert found(transformer_engine="2.5", flash_attn="2.8.3") == {"te-flash-attn-version": "warning"}
    assert found(transformer_engine="2.10", flash_attn="2.8.3") == {}
    assert found(transformer_engine="2.5", flash_attn="2.7.0", ccs=((10, 0),)) == {"te-flash-attn-version": "warning"}
    assert found(transformer_engine="2.5", flash_attn="2.7.0", ccs=((9, 0),)) == {}


def test_needs_both_and_a_known_release():
    assert found(transformer_engine="1.10") == {}
    assert found(flash_attn="2.8.3") == {}
    assert found(transformer_engine="9.0", flash_attn="2.8.3") == {}


def test_rows_do_not_overlap_and_carry_their_source():
    for row in ROWS:
        assert row["source"].startswith("https://github.com/NVIDIA/TransformerEngine/blob/v")
        assert row["outside"] in {"error", "fallback"}
        holding = [r for r in ROWS if SpecifierSet(r["versions"]).contains(a_release_of(row))]
        assert holding == [row]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(ROWS), st.sampled_from(FLASH_RELEASES))
def test_a_finding_iff_the_version_is_outside_the_release_range(row, flash):
    low, high = Version(row["flash_min"]), Version(row.get("flash_max", "999"))
    severity = found(transformer_engine=a_release_of(row), flash_attn=flash, ccs=((9, 0),))
    if low <= Version(flash) <= high:
        assert severity == {}
    else:
        assert severity == {"te-flash-attn-version": "error" if row["outside"] == "error" else "warning"}
