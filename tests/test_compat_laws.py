"""The laws of the compatibility engine, as hypothesis properties over the real tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.compat import (
    Combination,
    CudaVersion,
    DriverVersion,
    Severity,
    arch_list_for,
    check,
    environments,
    parse_arch,
    recommend,
    targetable_arches,
)
from gptforge.compat.facts import facts
from gptforge.errors import GptforgeError

LAW = settings(max_examples=examples(60), deadline=None)

F = facts()
CUDAS = [CudaVersion(*key) for key in sorted(F.cuda)]
ARCH_CUDAS = [CudaVersion(*key) for key in sorted(F.arches)]
TABLE_DRIVERS = sorted({r.ga_driver for r in F.cuda.values()} | {d for r in F.cuda.values() for d in r.updates.values()}
                       | set(F.minor_compat.values()))
KNOWN_CCS = sorted({a.cc for a in F.known_arches})

random_drivers = st.builds(lambda a, b, c: DriverVersion((a, b, c)), st.integers(380, 700), st.integers(0, 150),
                           st.integers(0, 99))
drivers = st.sampled_from(TABLE_DRIVERS) | random_drivers
ccs_lists = st.lists(st.sampled_from(KNOWN_CCS), max_size=3)


def codes(findings, severity=Severity.ERROR):
    return {f.code for f in findings if f.severity is severity}


def driver_too_old(driver, cuda) -> bool:
    return "driver-too-old" in codes(check(Combination(driver=str(driver), torch_cuda=str(cuda))))


# 1 -------------------------------------------------------------------------------------------
@LAW
@given(drivers, drivers, st.sampled_from(CUDAS))
def test_newer_driver_never_loses_a_cuda(d1, d2, cuda):
    low, high = sorted([d1, d2])
    if not driver_too_old(low, cuda):
        assert not driver_too_old(high, cuda)


# 2 -------------------------------------------------------------------------------------------
@LAW
@given(st.sampled_from(CUDAS), st.sampled_from(CUDAS))
def test_minor_compatibility_holds_inside_a_major(a, b):
    """A driver that runs one CUDA X.a natively runs every X.b of a major with minor compatibility."""
    floor = F.minor_compat.get(a.major)
    if a.major != b.major or floor is None:
        return
    native = F.toolkit_driver(a)
    assert not driver_too_old(max(native, floor), b)
    assert not driver_too_old(floor, b)


# 3 -------------------------------------------------------------------------------------------
@LAW
@given(st.sampled_from(CUDAS), st.sampled_from(CUDAS))
def test_minor_compatibility_never_crosses_a_major(older, newer):
    """The newest driver of an older major's line (just below the next floor) never runs a newer major."""
    if newer.major <= older.major or newer.major not in F.minor_compat:
        return
    floor = F.runtime_floor(newer)
    below = DriverVersion((floor.parts[0] - 1, 99, 99))
    assert driver_too_old(below, newer)


# 4 -------------------------------------------------------------------------------------------
@LAW
@given(drivers, ccs_lists)
def test_recommendation_always_passes_check(driver, ccs):
    result = recommend(driver, ccs)
    if result.chosen is None:
        assert all(not v.fits for v in result.verdicts if v.environment.is_gpu)
        return
    findings = check(result.chosen.combination(str(driver), ccs))
    assert codes(findings) == set(), findings
    assert all(result.chosen.covers(cc) for cc in ccs)


# 5 -------------------------------------------------------------------------------------------
@LAW
@given(ccs_lists.filter(bool), st.sampled_from(ARCH_CUDAS), st.booleans())
def test_arch_list_only_holds_targetable_arches(ccs, cuda, allow_suffix):
    try:
        listed = arch_list_for(ccs, cuda, allow_suffix=allow_suffix).split(";")
    except GptforgeError:
        assert "gpu-arch-unsupported" in codes(check(Combination(ccs=tuple(ccs), cuda=str(cuda))))
        return
    assert set(listed) <= set(targetable_arches(cuda))
    if not allow_suffix:
        assert all(not parse_arch(a).suffix for a in listed)


# 6 -------------------------------------------------------------------------------------------
@LAW
@given(drivers, ccs_lists)
def test_recommended_environment_arch_list_is_targetable(driver, ccs):
    result = recommend(driver, ccs)
    if result.chosen is None or result.chosen.cuda is None or not ccs:
        return
    listed = arch_list_for(ccs, result.chosen.cuda)  # must not raise: the env passed gpu-arch-unsupported
    assert set(listed.split(";")) <= set(targetable_arches(result.chosen.cuda))


# 7 -------------------------------------------------------------------------------------------
def test_newer_cuda_never_lowers_the_host_compiler_ceiling():
    """Holds in the data: gcc_max and clang_max never decrease from one CUDA release to the next."""
    rows = [F.compilers[key] for key in sorted(F.compilers)]
    for field in ("gcc_max", "clang_max", "gcc_min"):
        values = [getattr(r, field) for r in rows if getattr(r, field) is not None]
        assert values == sorted(values), field


@LAW
@given(st.sampled_from(sorted(F.compilers)), st.sampled_from(sorted(F.compilers)), st.integers(5, 16))
def test_gcc_accepted_by_an_older_nvcc_is_accepted_by_a_newer_one(k1, k2, gcc):
    old, new = sorted([k1, k2])
    old_ok = "gcc-unsupported" not in codes(check(Combination(cuda="%d.%d" % old, gcc=str(gcc))))
    new_rejects_as_too_new = F.compilers[new].gcc_max is not None and gcc > F.compilers[new].gcc_max
    if old_ok:
        assert not new_rejects_as_too_new


# 8 -------------------------------------------------------------------------------------------
def test_arch_support_ends_only_at_the_bottom():
    """Targetable-arch lists are NOT contiguous numeric ranges (12.8 has sm_120 but sm_103 came in 12.9).
    The law that holds: the lowest targetable arch never decreases, and an arch that a newer toolkit drops
    is either below every arch it keeps (old generations retire from the bottom) or a documented rename."""
    previous = None
    for key in sorted(F.arches):
        base = {a for a in F.arches[key] if not a.suffix}
        if previous is not None:
            assert min(base) >= min(previous)
            for dropped in previous - base:
                renamed = dropped in F.renames and key >= F.renames[dropped][1]
                assert renamed or dropped < min(base), (key, dropped)
        previous = base


@LAW
@given(st.sampled_from(ARCH_CUDAS))
def test_targetable_arches_are_known_and_suffixes_have_their_base(cuda):
    arches = [parse_arch(a) for a in targetable_arches(cuda)]
    assert all(a.base in F.known_arches for a in arches)
    assert all(a.base in arches for a in arches if a.suffix)
    assert arches == sorted(arches)


# 9 -------------------------------------------------------------------------------------------
@LAW
@given(drivers, ccs_lists, st.sampled_from(CUDAS), st.sampled_from(["2.11.0+cu130", "2.13.0+cu126", "2.8.0+cu128"]))
def test_check_is_order_independent_over_gpus(driver, ccs, cuda, torch):
    results = {tuple(check(Combination(driver=str(driver), ccs=tuple(p), cuda=str(cuda), torch=torch)))
               for p in itertools.permutations(ccs)}
    assert len(results) == 1


# 10 ------------------------------------------------------------------------------------------
FULL = Combination(driver="535.104.05", ccs=((9, 0), (7, 0)), cuda="13.0", torch="2.11.0", torch_cuda="12.8",
                   python="3.9", gcc="16", cudnn="8.9.7", nccl="2.18.1", apex="6424da3b", deepspeed="0.19.6",
                   transformer_engine="2.18", torch_cuda_arch_list_env="9.0a")
FIELDS = [f for f in FULL.__dataclass_fields__]


@LAW
@given(st.sets(st.sampled_from(FIELDS)))
def test_forgetting_fields_never_adds_errors(removed):
    partial = Combination(**{f: (None if f in removed else getattr(FULL, f)) for f in FIELDS})
    assert codes(check(partial)) <= codes(check(FULL))


UNKNOWN_TO_TABLES = {  # 2.12: a release whose table may lack builds (a complete one names an unlisted build unpublished)
    "CUDA": {"cuda": "14.9", "torch": "2.12.0+cu149"},
    "torch release": {"torch": "9.99.0+cu130"},
    "torch CUDA variant": {"cuda": "13.1", "torch": "2.12.0+cu131"},
    "cuDNN minor": {"cudnn": "9.99.1"},
}


@pytest.mark.parametrize("change", UNKNOWN_TO_TABLES.values(), ids=list(UNKNOWN_TO_TABLES))
def test_a_version_the_tables_do_not_know_never_adds_errors(change):
    """What the tables do not know is reported as a warning and skipped, never judged an error."""
    base = dict(driver="580.65.06", ccs=((9, 0),), cuda="13.0", torch="2.11.0+cu130", python="3.12", gcc="13")
    assert codes(check(Combination(**base))) == set()
    findings = check(Combination(**{**base, **change}))
    assert codes(findings) == set()
    assert codes(findings, Severity.WARNING) & {"cuda-unknown", "torch-unknown", "torch-cuda-variant-unknown"} or \
        "cudnn" in change


# 11 ------------------------------------------------------------------------------------------
@LAW
@given(st.builds(
    Combination,
    driver=st.none() | drivers.map(str),
    ccs=st.none() | ccs_lists.map(tuple),
    cuda=st.none() | st.sampled_from(CUDAS).map(str),
    torch=st.none() | st.sampled_from(["2.0.1+cu118", "2.6.0+cu126", "2.11.0+cu130", "2.13.0+cu126", "2.13.0+cpu"]),
    gcc=st.none() | st.integers(5, 16).map(str),
    python=st.none() | st.sampled_from(["3.8", "3.12", "3.15"]),
    cudnn=st.none() | st.sampled_from(["8.9.7", "9.10.2", "9.17.0"]),
    deepspeed=st.none() | st.just("0.19.6"),
    transformer_engine=st.none() | st.just("2.18"),
    apex=st.none() | st.just("6424da3b"),
    torch_cuda_arch_list_env=st.none() | st.sampled_from(["9.0a", "8.0;9.0", "7.0"]),
))
def test_every_error_has_a_fix_and_findings_are_sorted(combo):
    findings = check(combo)
    assert all(f.fix.strip() for f in findings if f.severity is Severity.ERROR)
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    assert [order[f.severity] for f in findings] == sorted(order[f.severity] for f in findings)
    assert check(combo) == findings  # deterministic


# 12 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", environments(), ids=lambda e: e.name)
def test_every_environment_passes_check(env):
    for gcc in env.gcc:
        assert codes(check(env.combination(gcc=gcc))) == set()
    if env.is_gpu:
        ccs = tuple(parse_arch(a).cc for a in env.sm)
        findings = check(env.combination(env.min_driver, ccs))
        # at its own minimum driver only warnings (minor-version compatibility) may remain,
        # except GPUs that need a newer driver than the CUDA line's floor (Blackwell needs R570)
        assert codes(findings) <= {"gpu-newer-than-driver"}
        newest = check(env.combination("999.99.99", ccs))
        assert codes(newest) == set()
        assert codes(newest, Severity.WARNING) == set()


@LAW
@given(drivers, ccs_lists)
def test_driver_too_old_iff_below_the_runtime_floor(driver, ccs):
    for cuda in ("12.6", "13.0"):
        floor = F.runtime_floor(CudaVersion(*map(int, cuda.split("."))))
        assert driver_too_old(driver, cuda) == (driver < floor)


# 16 ------------------------------------------------------------------------------------------
FERMI = [cc for cc in KNOWN_CCS if cc < (3, 0)]
TORCH_BUILDS = [f"{r.release}.0+cu{v.cuda.major}{v.cuda.minor}" for r in F.torch.values() for v in r.variants
                if v.channel != "conda-forge"]


@LAW
@given(st.sampled_from(FERMI), st.sampled_from(TORCH_BUILDS))
def test_no_torch_build_runs_on_a_gpu_below_torchs_floor(cc, torch):
    """Fermi is known to the tables, so it is judged, not refused; and no torch release from 0.4 on runs on it,
    whether the build's arch list is known or not."""
    assert "gpu-too-old-for-torch" in codes(check(Combination(ccs=(cc,), torch=torch)))


@LAW
@given(st.sampled_from([cc for cc in KNOWN_CCS if cc >= (3, 0)]), st.sampled_from(TORCH_BUILDS))
def test_the_torch_floor_never_flags_a_gpu_at_or_above_it(cc, torch):
    assert "gpu-too-old-for-torch" not in codes(check(Combination(ccs=(cc,), torch=torch)))
