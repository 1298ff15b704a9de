"""NCCL against the torch wheel that loads it: the wheel's pinned NCCL (its METADATA) is the floor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from conftest import examples
from gptforge.compat import Combination, check
from gptforge.compat.facts import load_table
from gptforge.compat.findings import Severity

FAST = settings(max_examples=examples(100), deadline=None)


def codes(severity=Severity.ERROR, **fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity is severity}


def _pins() -> list[tuple[str, Version]]:
    rows = load_table("torch_pypi_builds.toml")["wheel"]
    return [(row["version"], Version(row["nccl"])) for row in rows if "nccl" in row]


def test_an_older_nccl_than_the_wheel_pins_is_an_error():
    # scientific-computing-examples#157: torch 2.13.0 (pins nvidia-nccl-cu13==2.29.7) with nvidia-nccl-cu12 2.21.5:
    # 'libtorch_cuda.so: undefined symbol: ncclCommResume'
    assert codes(torch="2.13.0+cu130", nccl="2.21.5", python="3.12") == {"nccl-too-old-for-torch"}
    assert codes(torch="2.13.0+cu126", nccl="2.27.5") == {"nccl-too-old-for-torch"}  # cu126 pins 2.29.3


def test_an_untagged_torch_is_pypi_s_build_only_by_assumption_so_a_warning():
    assert codes(torch="2.13.0", nccl="2.21.5") == set()
    assert "nccl-too-old-for-torch" in codes(Severity.WARNING, torch="2.13.0", nccl="2.21.5")
    found = [f for f in check(Combination(torch="2.13.0", nccl="2.21.5")) if f.code == "nccl-too-old-for-torch"]
    assert "torch 2.6.0" in found[0].fix  # the newest torch whose wheel pins NCCL 2.21


def test_the_pinned_nccl_or_a_newer_one_is_silent():
    assert codes(Severity.ERROR, torch="2.13.0", nccl="2.29.7") == set()
    assert codes(Severity.WARNING, torch="2.13.0", nccl="2.30.1") == set()
    assert codes(torch="2.1.2", nccl="2.18.6") == set()


def test_an_older_patch_of_the_pinned_minor_is_a_warning():
    assert codes(Severity.ERROR, torch="2.13.0", nccl="2.29.3") == set()
    assert "nccl-too-old-for-torch" in codes(Severity.WARNING, torch="2.13.0", nccl="2.29.3")


@pytest.mark.parametrize("fields", [
    {"torch": "1.13.1", "nccl": "2.10.3"},  # carries its NCCL (the wheel pins none)
    {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.21.5"},  # untagged beside a toolkit: may be conda's build
    {"torch": "2.13.0", "torch_cuda": "12.9", "nccl": "2.21.5"},  # conda-forge's cu129 build links conda's NCCL
])
def test_a_torch_not_known_to_load_a_pinned_nccl_wheel_is_not_judged(fields):
    assert "nccl-too-old-for-torch" not in codes(**fields) | codes(Severity.WARNING, **fields)


@FAST
@given(st.sampled_from(_pins()), st.integers(0, 40), st.integers(0, 12))
def test_the_verdict_follows_the_order_of_nccl_versions(pin, minor, patch):
    # law: for PyPI's wheel given untagged, a warning exactly where the NCCL is below the pin, never an error
    torch, pinned = pin
    nccl = Version(f"2.{minor}.{patch}")
    assert "nccl-too-old-for-torch" not in codes(torch=torch, nccl=str(nccl))
    assert ("nccl-too-old-for-torch" in codes(Severity.WARNING, torch=torch, nccl=str(nccl))) == (nccl < pinned)
