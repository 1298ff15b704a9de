"""The engine on real, published combinations: ones that work and ones users hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import documented_codes, emitted_codes
from gptforge.compat import Combination, Severity, arch_list_for, check, environment, recommend, targetable_arches
from gptforge.errors import GptforgeError

REPO = Path(__file__).resolve().parents[1]


def errors(**fields):
    return {f.code for f in check(Combination(**fields)) if f.severity is Severity.ERROR}


def codes(severity, **fields):
    return {f.code for f in check(Combination(**fields)) if f.severity is severity}


WORKING = {
    "H100, driver 580, torch 2.11+cu130, nvcc 13.0, apex": dict(
        driver="580.65.06", ccs=((9, 0),), cuda="13.0", torch="2.11.0+cu130", python="3.12", gcc="13.3",
        apex="6424da3b", torch_cuda_arch_list_env="9.0a"),
    "A100, driver 535 (R535 LTSB), torch 2.4.1+cu121": dict(
        driver="535.104.05", ccs=((8, 0),), torch="2.4.1+cu121", python="3.11", cudnn="9.1.0.70"),
    "RTX 5090, driver 570, torch 2.7.1+cu128": dict(driver="570.124.06", ccs=((12, 0),), torch="2.7.1+cu128"),
    "H100, driver 550, torch 2.6.0+cu124, nvcc 12.4, gcc 13": dict(
        driver="550.54.14", ccs=((9, 0),), cuda="12.4", torch="2.6.0+cu124", gcc="13", python="3.12"),
    "V100, driver 535, torch 2.13.0+cu126, nvcc 12.6": dict(
        driver="535.104.05", ccs=((7, 0),), cuda="12.6", torch="2.13.0+cu126", gcc="13.2", cudnn="9.10.2.21"),
    "L40S, torch 2.11+cu130, TransformerEngine 2.18": dict(
        driver="580.82.07", ccs=((8, 9),), torch="2.11.0+cu130", cuda="13.0", cudnn="9.19.0.56",
        transformer_engine="2.18"),
    "DeepSpeed, nvcc 12.9 with torch cu128 (whitelisted minors)": dict(
        cuda="12.9", torch="2.7.1+cu128", deepspeed="0.19.6", torch_cuda_arch_list_env="9.0", ccs=((9, 0),)),
}


@pytest.mark.parametrize("fields", WORKING.values(), ids=list(WORKING))
def test_published_working_combinations_pass(fields):
    assert errors(**fields) == set()


BROKEN = {
    "torch cu130 on a 535 driver": (dict(driver="535.104.05", ccs=((9, 0),), torch="2.11.0+cu130"), "driver-too-old"),
    "torch cu130 on R570 ('found version 12080')": (dict(driver="570.124.06", torch="2.11.0+cu130"), "driver-too-old"),
    "CUDA 10.2 has no minor compatibility": (dict(driver="418.87.00", cuda="10.2"), "driver-too-old"),
    "RTX 5090 with torch 2.7+cu126 (sm_120 not compiled)": (
        dict(ccs=((12, 0),), torch="2.7.0+cu126"), "gpu-arch-not-in-torch"),
    "V100 with torch 2.11+cu130": (dict(ccs=((7, 0),), torch="2.11.0+cu130"), "gpu-arch-not-in-torch"),
    "V100 with nvcc 13.0 ('Unsupported gpu architecture compute_70')": (
        dict(ccs=((7, 0),), cuda="13.0"), "gpu-arch-unsupported"),
    "RTX 5090 with nvcc 12.6 ('compute_120')": (dict(ccs=((12, 0),), cuda="12.6"), "gpu-arch-unsupported"),
    "H100 on R470": (dict(driver="470.82.01", ccs=((9, 0),)), "gpu-newer-than-driver"),
    "nvcc 12.1 with torch cu118": (dict(cuda="12.1", torch="2.0.1+cu118"), "nvcc-torch-mismatch"),
    "apex with nvcc 12.9 and torch cu128": (dict(cuda="12.9", torch="2.7.1+cu128", apex="6424da3b"),
                                            "apex-nvcc-mismatch"),
    "gcc 14 with CUDA 12.4 (Ubuntu 25.04)": (dict(cuda="12.4", gcc="14.2"), "gcc-unsupported"),
    "clang 20 with CUDA 12.8": (dict(cuda="12.8", clang="20.1"), "clang-unsupported"),
    "gcc 10 with torch 2.13 (C++20 headers)": (dict(torch="2.13.0+cu130", gcc="10.5"), "cxx-standard-unsupported"),
    "nvcc 11.8 with torch 2.13": (dict(torch="2.13.0", cuda="11.8"), "cxx-standard-unsupported"),
    "Python 3.12 with torch 2.1 (no cp312 wheel)": (dict(torch="2.1.0", python="3.12"), "python-unsupported"),
    "cuDNN 9.10 (CUDA 12 build) with torch cu130": (dict(torch="2.11.0+cu130", cudnn="9.10.2"),
                                                    "cudnn-cuda-mismatch"),
    "cuDNN 9.17 on a V100": (dict(ccs=((7, 0),), cudnn="9.17.0"), "cudnn-arch-unsupported"),
    "older cuDNN 8 minor than torch ships (8.0.3 vs 8.9.2)": (dict(torch="2.1.2+cu121", cudnn="8.0.3"), "cudnn-torch-mismatch"),
    "TransformerEngine on a T4": (dict(ccs=((7, 5),), transformer_engine="2.18"), "te-unsupported"),
    "TransformerEngine with cuDNN 8.9": (dict(cudnn="8.9.7", transformer_engine="2.18"), "te-unsupported"),
    "DeepSpeed, nvcc 13.2 with torch cu130 (13.x not whitelisted)": (
        dict(cuda="13.2", torch="2.11.0+cu130", deepspeed="0.19.6"), "deepspeed-cuda-mismatch"),
    "DeepSpeed with TORCH_CUDA_ARCH_LIST=9.0a": (
        dict(ccs=((9, 0),), cuda="13.0", deepspeed="0.19.6", torch_cuda_arch_list_env="9.0a"), "deepspeed-arch-suffix"),
    "TORCH_CUDA_ARCH_LIST=7.0 with nvcc 13.0": (dict(cuda="13.0", torch_cuda_arch_list_env="7.0"),
                                               "arch-list-untargetable"),
    "TORCH_CUDA_ARCH_LIST=8.0 on an H100... runs; 9.0 on an A100 does not": (
        dict(ccs=((8, 0),), torch_cuda_arch_list_env="9.0"), "arch-list-misses-gpu"),
}


@pytest.mark.parametrize("fields, code", BROKEN.values(), ids=list(BROKEN))
def test_published_failures_are_caught(fields, code):
    findings = [f for f in check(Combination(**fields)) if f.code == code]
    assert findings and findings[0].severity is Severity.ERROR
    assert findings[0].fix


def test_driver_too_old_fix_names_a_cuda12_environment():
    (finding,) = [f for f in check(Combination(driver="535.104.05", ccs=((9, 0),), torch="2.11.0+cu130"))
                  if f.code == "driver-too-old"]
    env = finding.fix.split("use the ")[1].split(" environment")[0]
    assert environment(env).cuda.startswith("12.")
    assert f"pixi run -e {env} setup" in finding.fix


def test_minor_mismatch_is_a_warning_for_torch_alone():
    assert codes(Severity.WARNING, cuda="12.9", torch="2.7.1+cu128") == {"nvcc-torch-mismatch"}


def test_minor_compatibility_warns_about_ptx():
    assert "ptx-newer-than-driver" in codes(Severity.WARNING, driver="535.104.05", torch="2.7.1+cu128")
    assert "ptx-newer-than-driver" not in codes(Severity.WARNING, driver="570.124.06", torch="2.7.1+cu128")


def test_fp8():
    assert "fp8-unavailable" in codes(Severity.WARNING, ccs=((8, 0),), transformer_engine="2.18")
    assert "fp8-unavailable" in codes(Severity.INFO, ccs=((8, 0),))
    assert "fp8-unavailable" in codes(Severity.INFO, ccs=((8, 9),), torch="2.0.1+cu118")
    assert "fp8-unavailable" not in {f.code for f in check(Combination(ccs=((8, 9),), torch="2.1.2+cu121"))}
    assert "fp8-unavailable" not in {f.code for f in check(Combination(ccs=((9, 0), (8, 0))))}


def test_apex_contrib_needs_newer_cudnn_and_nccl():
    (finding,) = check(Combination(apex="6424da3b", cudnn="8.3.2", nccl="2.18.1"))
    assert finding.code == "apex-contrib-skipped" and finding.severity is Severity.INFO
    assert "cudnn_gbn" in finding.message and "nccl_allocator" in finding.message
    assert "nccl_p2p" not in finding.message
    assert check(Combination(apex="6424da3b", cudnn="9.10.2", nccl="2.29.7")) == []


def test_cuda_12_7_does_not_exist():
    assert "cuda-unknown" in codes(Severity.WARNING, cuda="12.7")


@pytest.mark.parametrize("unset", ["", "native"])
def test_arch_list_torch_chooses_itself_is_not_judged(unset):
    """torch's cpp_extension builds for the visible GPUs when TORCH_CUDA_ARCH_LIST is empty or 'native'."""
    assert check(Combination(ccs=((9, 0),), cuda="13.0", deepspeed="0.19.6", torch_cuda_arch_list_env=unset)) == []
    assert "arch-list-misses-gpu" in errors(ccs=((9, 0),), torch_cuda_arch_list_env=" ")


def test_named_arches_read_as_torch_reads_them():
    assert check(Combination(ccs=((9, 0),), cuda="13.0", torch_cuda_arch_list_env="Hopper")) == []
    assert errors(ccs=((8, 6),), cuda="12.6", torch_cuda_arch_list_env="Ampere;Hopper") == set()
    assert "arch-list-misses-gpu" in errors(ccs=((9, 0),), torch_cuda_arch_list_env="Ampere+Tegra")  # 8.7, no PTX
    assert "arch-list-untargetable" in errors(cuda="13.0", torch_cuda_arch_list_env="Volta")


def test_unreadable_field_is_a_warning_not_an_exception():
    assert "unreadable-version" in codes(Severity.WARNING, driver="banana", gcc="latest")


# --- arch functions ------------------------------------------------------------------------------

def test_targetable_arches():
    assert targetable_arches("13.0")[:7] == ["7.5", "8.0", "8.6", "8.7", "8.8", "8.9", "9.0"]
    assert "9.0a" in targetable_arches("12.4") and "10.0" not in targetable_arches("12.4")
    assert {"10.0a", "10.1a", "12.0a"} <= set(targetable_arches("12.8")) and "10.3" not in targetable_arches("12.8")
    assert "7.0" in targetable_arches("12.9") and "7.0" not in targetable_arches("13.0")
    assert "10.1" not in targetable_arches("13.0") and "11.0" in targetable_arches("13.0")
    with pytest.raises(GptforgeError):
        targetable_arches("14.9")


@pytest.mark.parametrize(
    "ccs, cuda, suffix, expected",
    [([(9, 0)], "13.0", True, "9.0a"), ([(9, 0)], "13.0", False, "9.0"), ([(9, 0), (9, 0)], "12.6", False, "9.0"),
     ([(8, 9), (9, 0)], "12.4", True, "8.9;9.0a"), ([(8, 0), (8, 6)], "11.8", True, "8.0;8.6"),
     ([(8, 9)], "11.1", True, "8.6"), ([(7, 0), (9, 0)], "13.0", False, "9.0")],
)
def test_arch_list_for(ccs, cuda, suffix, expected):
    assert arch_list_for(ccs, cuda, allow_suffix=suffix) == expected


def test_arch_list_for_raises_when_nothing_is_targetable():
    with pytest.raises(GptforgeError, match="none of the GPUs"):
        arch_list_for([(7, 0)], "13.0")
    with pytest.raises(GptforgeError):
        arch_list_for([], "13.0")


# --- recommend -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "driver, ccs, expected",
    [("580.65.06", [(9, 0)], "cuda-13-0"), ("580.95.05", [(12, 0)], "cuda-13-0"),
     ("570.124.06", [(10, 0)], "cuda-12-9"), ("565.57.01", [(8, 0)], "cuda-12-6"),
     ("535.104.05", [(7, 0)], "cuda-12-6"), ("580.65.06", [(6, 0)], "cuda-12-6"),
     ("535.104.05", [(9, 0)], "cuda-12-9")],
)
def test_recommend(driver, ccs, expected):
    assert recommend(driver, ccs).chosen.name == expected


def test_recommend_explains_every_environment_and_fails_on_old_drivers():
    result = recommend("470.82.01", [(8, 0)])
    assert not result.ok
    assert {v.environment.name for v in result.verdicts} == {"cpu", "cuda-12-6", "cuda-12-9", "cuda-13-0", "hopper"}
    assert all(v.reasons for v in result.verdicts if not v.fits)
    assert "525.60.13" in result.reason
    assert not recommend("580.65.06", [(3, 7)]).ok  # Kepler: no environment has kernels for it


def test_every_finding_code_is_documented():
    """Finding codes are an API: each code the engine can emit has a row in docs/compat.md, and no row is stale."""
    emitted = emitted_codes(REPO / "src/gptforge/compat")
    assert "torch-cuda-conflict" in emitted and len(emitted) >= 25
    assert emitted == documented_codes(REPO / "docs/compat.md", "Finding codes (stable API)")
