"""apex, DeepSpeed, TransformerEngine and flash-attn: each floor applies to the releases it was read from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import examples
from gptforge.compat import Combination, Severity, check
from gptforge.compat.facts import facts

EXT = facts().extensions
VERSIONED = {
    "deepspeed.torch": EXT["deepspeed"]["torch"],
    "deepspeed.minor_mismatch_ok": EXT["deepspeed"]["minor_mismatch_ok"],
    "transformer_engine.requires": EXT["transformer_engine"]["requires"],
    "flash_attn": EXT["flash_attn"],
}


def codes(severity=Severity.ERROR, **fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity is severity}


def messages(**fields) -> list[str]:
    return [f.message for f in check(Combination(**fields))]


@pytest.mark.parametrize("table", VERSIONED)
def test_every_row_names_its_releases_and_a_source_at_a_tag(table):
    for row in VERSIONED[table]:
        SpecifierSet(row["versions"])  # parses
        assert row["source"].startswith("https://github.com/"), row
    tagged = [r for r in VERSIONED[table] if "/blob/" in r["source"]]
    assert all("/blob/main/" not in r["source"] and "/blob/master/" not in r["source"] for r in tagged)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(sorted(VERSIONED)), st.integers(0, 3), st.integers(0, 25), st.integers(0, 6))
def test_at_most_one_row_applies_to_a_release(table, major, minor, patch):
    version = Version(f"{major}.{minor}.{patch}")
    matching = [r for r in VERSIONED[table] if SpecifierSet(r["versions"]).contains(version, prereleases=True)]
    assert len(matching) <= 1, (version, matching)


def test_deepspeed_0_8_is_judged_by_its_own_torch_floor():
    assert "deepspeed-unsupported" not in codes(deepspeed="0.8.1", torch="1.13.1+cu117")
    assert "deepspeed-unsupported" in codes(deepspeed="0.8.1", torch="1.7.1")
    assert "deepspeed-unsupported" in codes(deepspeed="0.19.5", torch="1.13.1+cu117")


def test_deepspeed_whitelist_follows_the_release():
    # 0.8.1's builder.py has no CUDA 12 whitelist; 0.9.3 accepts 12.0 with 12.1
    assert "deepspeed-cuda-mismatch" in codes(deepspeed="0.8.1", cuda="12.1", torch_cuda="12.0")
    assert "deepspeed-cuda-mismatch" in codes(Severity.INFO, deepspeed="0.9.3", cuda="12.1", torch_cuda="12.0")
    assert "deepspeed-cuda-mismatch" in codes(deepspeed="0.16.0", cuda="12.8", torch_cuda="12.6")
    assert "deepspeed-cuda-mismatch" in codes(Severity.INFO, deepspeed="0.17.2", cuda="12.9", torch_cuda="12.8")


def test_transformer_engine_1_x_is_not_judged_by_2_x_floors():
    assert "te-unsupported" not in codes(transformer_engine="1.1", torch="2.0.1+cu118", cuda="11.8",
                                         cudnn="8.7.0")
    assert "te-unsupported" in codes(transformer_engine="2.1", torch="2.0.1+cu118", cuda="11.8")
    assert "te-unsupported" in codes(transformer_engine="1.11", torch="2.0.1+cu118", cuda="11.8")
    assert "te-unsupported" in codes(transformer_engine="1.5", ccs=((8, 9),), cuda="11.8")  # Ada needs 12.1
    assert "te-unsupported" not in codes(transformer_engine="1.5", ccs=((9, 0),), cuda="11.8")


def test_unknown_facts_say_not_checked_instead_of_ok():
    def not_checked(**fields) -> str:
        return " | ".join(f.message for f in check(Combination(**fields)) if f.code == "not-checked")

    assert "TransformerEngine 0.13" in not_checked(transformer_engine="0.13")
    assert "GPUs TransformerEngine 1.5" in not_checked(transformer_engine="1.5", ccs=((7, 0),))
    assert "torch DeepSpeed 0.5.0" in not_checked(deepspeed="0.5.0", torch="1.8.0")
    assert "flash-attn 1.0.9" in not_checked(flash_attn="1.0.9")


def test_flash_attn_nvcc_floor_at_each_tag():
    assert "flash-attn-unsupported" not in codes(flash_attn="2.0.4", cuda="11.3")  # v2.0.0: CUDA 11
    assert "flash-attn-unsupported" in codes(flash_attn="2.0.6", cuda="11.3")  # v2.0.6: 11.4
    assert "flash-attn-unsupported" in codes(flash_attn="2.1.2", cuda="11.4")  # v2.1.2: 11.6
    assert "flash-attn-unsupported" not in codes(flash_attn="2.4.2", cuda="11.6")  # v2.4.2: setup.py's 11.6
    # v2.4.3 to v2.6.3: setup.py says 11.6, but the kernels' __grid_constant__ needs nvcc 11.7
    # (Dao-AILab/flash-attention#1206)
    assert "flash-attn-unsupported" in codes(flash_attn="2.4.3", cuda="11.6")
    assert "flash-attn-unsupported" in codes(flash_attn="2.6.3", cuda="11.6")
    assert "flash-attn-unsupported" not in codes(flash_attn="2.6.3", cuda="11.7")
    assert "flash-attn-unsupported" in codes(flash_attn="2.7.0", cuda="11.6")  # v2.7.0: setup.py's 11.7


def _flash_attn_nvcc_floor(version: Version) -> Version | None:
    row = next((r for r in EXT["flash_attn"] if SpecifierSet(r["versions"]).contains(version, prereleases=True)),
               None)
    return Version(row["nvcc_min"]) if row else None


@settings(max_examples=examples(200), deadline=None)
@given(st.tuples(st.integers(0, 9), st.integers(0, 4)), st.tuples(st.integers(0, 9), st.integers(0, 4)))
def test_flash_attn_nvcc_floor_never_falls_with_the_release(older, newer):
    older_version, newer_version = sorted((Version(f"2.{older[0]}.{older[1]}"), Version(f"2.{newer[0]}.{newer[1]}")))
    low, high = _flash_attn_nvcc_floor(older_version), _flash_attn_nvcc_floor(newer_version)
    if low and high:
        assert low <= high, (older_version, newer_version)


def test_transformer_engine_gpu_floor_from_the_release_whose_readme_states_it():
    """README "Hardware: Blackwell, Hopper, Grace Hopper/Blackwell, Ada, Ampere" ships from v2.3 (#1689): Turing is
    below it there; v2.2's README states no floor (not checked)."""
    assert "te-unsupported" in codes(transformer_engine="2.3", ccs=((7, 5),))
    assert "te-unsupported" in codes(transformer_engine="2.4.0", ccs=((7, 0),))
    assert "te-unsupported" not in codes(transformer_engine="2.3", ccs=((8, 0),))
    assert "te-unsupported" not in codes(transformer_engine="2.2", ccs=((7, 5),))
    assert "not-checked" in codes(Severity.INFO, transformer_engine="2.2", ccs=((7, 5),))


def test_a_flash_attn_version_without_its_patch_is_judged_by_every_release_of_it():
    # Every 2.x release refuses GPUs below Ampere (csrc/flash_attn/flash_api.cpp at each tag).
    assert "flash-attn-arch-unsupported" in codes(flash_attn="2", ccs=((7, 5),))  # flash-attention#762
    assert "flash-attn-arch-unsupported" in codes(flash_attn="2", ccs=((5, 2),))  # flash-attention#406
    assert "flash-attn-arch-unsupported" not in codes(Severity.WARNING, flash_attn="2", ccs=((8, 6),))
    assert not codes(flash_attn="2", ccs=((8, 6),), driver="515.65.01")  # flash-attention#802
    # nvcc 10.2 is below every 2.x floor; 11.2 only below 2.0.6's and later ones; 11.6 only below 2.4.3's.
    assert "flash-attn-unsupported" in codes(flash_attn="2", cuda="10.2")
    assert "flash-attn-unsupported" not in codes(flash_attn="2", cuda="11.2")
    assert "flash-attn-unsupported" in codes(Severity.WARNING, flash_attn="2", cuda="11.2")
    assert "flash-attn-unsupported" in codes(Severity.WARNING, flash_attn="2.4", cuda="11.6")
    assert "flash-attn-unsupported" in codes(flash_attn="2.5", cuda="11.6")  # every 2.5.x has __grid_constant__
    assert "flash-attn-unsupported" in codes(flash_attn="2.4.3", cuda="11.6")  # a full version is that release


SERIES = ["2", "2.0", "2.1", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8"]


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(SERIES), st.sampled_from([None, "10.2", "11.2", "11.4", "11.6", "11.7", "12.4", "12.8"]),
       st.sampled_from([(5, 2), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]))
def test_a_flash_attn_series_error_is_an_error_of_each_of_its_releases(series, cuda, cc):
    from gptforge.compat.extension_rules import flash_attn_series

    releases = flash_attn_series(Version(series))
    assert releases and all(str(r).startswith(series + ".") for r in releases)
    fields = {"cuda": cuda, "ccs": (cc,)}
    judged = codes(flash_attn=series, **fields) & {"flash-attn-unsupported", "flash-attn-arch-unsupported"}
    each = [codes(flash_attn=str(r), **fields) for r in releases]
    for code in ("flash-attn-unsupported", "flash-attn-arch-unsupported"):
        assert (code in judged) == all(code in found for found in each), (series, cuda, cc, code)
