"""What extension builds and prebuilt extension wheels ask of the combination: the arch an unset
TORCH_CUDA_ARCH_LIST makes torch's cpp_extension (per release) and DeepSpeed's JIT op builder build, PTX-only
extensions on a minor-compatibility driver, and the torch build each flash-attn wheel was compiled against."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.compat import Combination, Severity, check
from gptforge.compat.arches import Arch
from gptforge.compat.facts import facts
from gptforge.compat.wheel_rules import flash_attn_releases
from gptforge.core.versions import CudaVersion, parse_torch

LAW = settings(max_examples=examples(60), deadline=None)
F = facts()
ARCH_CUDAS = [CudaVersion(*key) for key in sorted(F.arches)]
KNOWN_CCS = sorted({a.cc for a in F.known_arches if not a.suffix})


def codes(severity=Severity.ERROR, **fields):
    return {f.code for f in check(Combination(**fields)) if f.severity is severity}


def fixes(**fields):
    return " ".join(f.fix for f in check(Combination(**fields)) if f.severity is not Severity.INFO)


# --- the arch an unset TORCH_CUDA_ARCH_LIST builds ----------------------------------------------------------------

def test_torch_before_1_8_builds_the_gpus_own_arch_uncapped():
    """apex#1296: torch 1.7.1's cpp_extension asks nvcc 11.0 for compute_86 on an RTX 3090; 1.8 caps it."""
    rtx3090 = dict(ccs=((8, 6),), cuda="11.0", apex="master")
    assert "gpu-arch-unsupported" in codes(**rtx3090, torch="1.7.1+cu110")
    assert "gpu-arch-unsupported" not in codes(**rtx3090, torch="1.7.1+cu110", torch_cuda_arch_list_env="8.0")
    assert "gpu-arch-unsupported" not in codes(ccs=((8, 6),), cuda="11.1", torch="1.8.1+cu111")


def test_deepspeeds_jit_op_builder_builds_the_gpus_own_arch_uncapped():
    """DeepSpeedExamples#634: torch 2.0.1+cu117's cpp_extension caps an RTX 4090 to sm_86; DeepSpeed's does not."""
    rtx4090 = dict(ccs=((8, 9),), cuda="11.7", torch="2.0.1+cu117")
    assert "gpu-arch-unsupported" not in codes(**rtx4090)
    assert "gpu-arch-unsupported" in codes(**rtx4090, deepspeed="0.9.0")
    assert "11.8" in fixes(**rtx4090, deepspeed="0.9.0")
    assert "gpu-arch-unsupported" not in codes(**rtx4090, deepspeed="0.9.0", torch_cuda_arch_list_env="8.6")


@LAW
@given(st.sampled_from(KNOWN_CCS), st.sampled_from(ARCH_CUDAS),
       st.sampled_from(["1.7.1", "1.13.1", "2.0.1", "2.6.0", "2.11.0"]), st.booleans())
def test_an_nvcc_that_targets_the_gpus_own_arch_never_gets_gpu_arch_unsupported(cc, cuda, torch, deepspeed):
    if Arch(*cc) not in F.targetable(cuda):
        return
    found = codes(ccs=(cc,), cuda=str(cuda), torch=torch, deepspeed="0.16.0" if deepspeed else None)
    assert "gpu-arch-unsupported" not in found


# --- extensions that reach a GPU only through nvcc's PTX ------------------------------------------------------------

def test_a_ptx_only_extension_on_a_minor_compat_driver_fails():
    v100 = dict(ccs=((7, 0),), cuda="12.6", torch="2.13.0+cu126", torch_cuda_arch_list_env="6.1+PTX")
    assert codes(**v100, driver="535.104.05") >= {"ptx-newer-than-driver"}
    assert "ptx-newer-than-driver" not in codes(**v100, driver="560.28.03")
    assert "ptx-newer-than-driver" not in codes(**{**v100, "torch_cuda_arch_list_env": "7.0+PTX"},
                                                driver="535.104.05")


@LAW
@given(st.integers(525, 600), st.integers(525, 600), st.sampled_from(["6.1+PTX", "7.0", "7.0+PTX", None]))
def test_a_newer_driver_never_adds_the_ptx_error(low, high, arch_list):
    low, high = sorted([low, high])
    fields = dict(ccs=((7, 0),), cuda="12.6", torch="2.13.0+cu126", torch_cuda_arch_list_env=arch_list)
    if "ptx-newer-than-driver" not in codes(**fields, driver=str(low)):
        assert "ptx-newer-than-driver" not in codes(**fields, driver=str(high))


# --- the torch build each flash-attn wheel was compiled against -------------------------------------------------------

def test_every_recorded_torch_build_parses_and_belongs_to_a_built_minor():
    for version, row in flash_attn_releases().items():
        for build in row["torch_builds"]:
            torch = parse_torch(build)
            assert torch.cuda is not None, (version, build)
            assert torch.release in row["torch"], (version, build)


def test_a_false_labelled_wheel_compiled_against_a_cxx11_torch_needs_the_cxx11_abi():
    """flash-attention#1783: 2.8.2's torch2.6 wheels were compiled against torch 2.6.0+cu126 (C++11 ABI)."""
    torch = dict(torch="2.6.0+cu124", python="3.11")
    bad = "flash_attn-2.8.2+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"
    good = "flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"
    assert codes(**torch, wheels=(bad,)) == {"wheel-abi-mismatch"}
    assert "flash-attn==2.7.4.post1" in fixes(**torch, wheels=(bad,))
    assert codes(**torch, wheels=(good,)) == set()
    assert codes(torch="2.6.0+cu126", python="3.11",
                 wheels=("flash_attn-2.8.2+cu12torch2.6cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",)) == set()
    assert codes(**torch, flash_attn="2.8.2") == {"wheel-abi-mismatch"}


def test_a_wheel_compiled_against_a_nightly_is_a_warning_with_the_next_release_compiled_against_the_release():
    """flash-attention#931: 2.5.7's torch2.3 wheel was compiled against 2.3.0.dev20240207; 2.5.8's against 2.3.0."""
    assert codes(Severity.WARNING, torch="2.3.0", python="3.10", flash_attn="2.5.7") >= {"wheel-built-against-nightly"}
    assert "flash-attn==2.5.8" in fixes(torch="2.3.0", python="3.10", flash_attn="2.5.7")
    assert "wheel-built-against-nightly" not in codes(Severity.WARNING, torch="2.3.0", python="3.10", flash_attn="2.5.8")
    # flash-attention#975: the nightly-built 2.6.0 torch2.4 wheel runs on torch 2.4.0: never an error
    assert codes(torch="2.4.0", python="3.10.14",
                 wheels=("flash_attn-2.6.0+cu122torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl",)) == set()


@pytest.mark.parametrize("torch", ["2.4.0+cu124", "2.5.1+cu124", "2.6.0+cu124", "2.6.0+cu126", "2.3.0+cu121"])
@pytest.mark.parametrize("flash_attn", ["2.5.7", "2.6.3", "2.7.4.post1", "2.8.2", "2.8.3"])
def test_the_release_a_fix_names_has_no_error_of_its_own(torch, flash_attn):
    fix = fixes(torch=torch, python="3.11", flash_attn=flash_attn)
    for named in re.findall(r"flash-attn==([\w.]+)", fix):
        assert not codes(torch=torch, python="3.11", flash_attn=named) & {"wheel-abi-mismatch", "wheel-torch-mismatch"}


# --- no prebuilt flash-attn wheel for this torch: pip compiles it --------------------------------------------------

def test_a_release_without_a_wheel_for_torchs_minor_is_compiled_from_source():
    """2U1/Qwen-VL-Series-Finetune#169: flash-attn 2.5.8 (wheels up to torch 2.3) on torch 2.6.0 compiles and fails;
    the wheel of a release built for torch 2.6 installs."""
    found = codes(Severity.WARNING, torch="2.6.0", cuda="12.4", python="3.11", flash_attn="2.5.8")
    assert "flash-attn-source-build" in found
    assert "flash-attn==2.7.4" in fixes(torch="2.6.0", cuda="12.4", python="3.11", flash_attn="2.5.8")
    assert "flash-attn-source-build" not in codes(Severity.WARNING, torch="2.6.0+cu124", python="3.11",
                                                  flash_attn="2.7.4.post1")


def test_a_cuda_major_or_python_the_release_has_no_wheel_for_is_compiled_from_source():
    """2.8.3's wheels are CUDA 12 only (flash-attention#2118: torch 2.9.1+cu130); 2.7.4.post1's stop at Python 3.13."""
    assert "flash-attn-source-build" in codes(Severity.WARNING, torch="2.9.1+cu130", python="3.12", flash_attn="2.8.3")
    assert "flash-attn-source-build" in codes(Severity.WARNING, torch="2.6.0+cu118", flash_attn="2.7.4.post1")
    assert "flash-attn-source-build" not in codes(Severity.WARNING, torch="2.6.0+cu118", flash_attn="2.7.3")
    wheel = "flash_attn-2.8.3+cu12torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"  # a wheel given: no build
    assert "flash-attn-source-build" not in codes(Severity.WARNING, torch="2.9.1+cu130", wheels=(wheel,))


RELEASES = sorted(flash_attn_releases())


@LAW
@given(st.sampled_from(RELEASES), st.sampled_from(RELEASES), st.sampled_from(["3.9", "3.10", "3.11", "3.12"]))
def test_the_release_the_source_build_fix_names_has_a_wheel_for_this_torch(release, minor_of, python):
    """Whatever the release and torch, the release the fix names is compiled from source no more."""
    row = flash_attn_releases()[minor_of]
    build = parse_torch(row["torch_builds"][-1])
    torch = f"{build.version.base_version}+cu{build.cuda.major}{build.cuda.minor}"
    fix = fixes(torch=torch, python=python, flash_attn=release)
    for named in re.findall(r"flash-attn==([\w.]+) \(it has a wheel", fix):
        assert "flash-attn-source-build" not in codes(Severity.WARNING, torch=torch, python=python, flash_attn=named)
