"""The traps the engine models beyond version floors: what cpp_extension, flash-attn and TE recipes really do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gptforge.compat import Combination, check, parse_driver
from gptforge.core.versions import CudaVersion


def codes(**fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity.value == "error"}


def infos(**fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity.value == "info"}


def test_unset_arch_list_builds_for_the_gpu_itself():
    # nvcc 11.5 has sm_86 but not sm_89: an unset TORCH_CUDA_ARCH_LIST asks for compute_89
    assert codes(ccs=((8, 9),), cuda="11.5") == {"gpu-arch-unsupported"}
    # capped by torch's highest arch: a cu113 torch (max sm_86) builds sm_86, which nvcc 11.5 has
    assert codes(ccs=((8, 9),), cuda="11.5", torch_arch_list=("sm_80", "sm_86")) == set()
    # an explicit list nvcc can target is fine
    assert codes(ccs=((8, 9),), cuda="11.5", torch_cuda_arch_list_env="8.6") == set()


def test_cpp_extension_table_per_release():
    assert codes(torch="2.9.0+cu128", cuda="12.8", torch_cuda_arch_list_env="10.1") == {"arch-list-unknown-to-torch"}
    assert codes(torch="1.13.1+cu117", cuda="11.8", torch_cuda_arch_list_env="8.0;9.0") >= {"arch-list-unknown-to-torch"}
    assert "arch-list-unknown-to-torch" not in codes(torch="2.13.0+cu130", cuda="13.0", torch_cuda_arch_list_env="9.0a")


def test_suffix_crash_only_where_the_parser_has_it():
    fields = dict(ccs=((9, 0),), torch_arch_list=("sm_90", "sm_90a"))
    assert codes(torch="2.5.1", **fields) == {"arch-list-suffix-crash"}
    assert codes(torch="2.5.1", torch_cuda_arch_list_env="9.0", **fields) == set()
    assert codes(torch="2.13.0", **fields) == set()
    assert "not-checked" in infos(torch="2.11.0", **fields)


def test_unknown_bundled_cudnn_is_not_checked_rather_than_ok():
    assert codes(torch="1.12.0+cu113", cudnn="8.0.3") == {"cudnn-torch-mismatch"}
    assert "not-checked" in infos(torch="2.12.1+cu129", cudnn="8.0.3")


def test_flash_attn_floors_follow_the_release():
    assert codes(flash_attn="2.4.2", cuda="11.6") == set()
    # setup.py let 11.6 through until 2.7.0, but from 2.4.3 the kernels need nvcc 11.7 (flash-attention#1206)
    assert codes(flash_attn="2.6.3", cuda="11.6") == {"flash-attn-unsupported"}
    assert codes(flash_attn="2.7.4.post1", cuda="11.6") == {"flash-attn-unsupported"}
    assert codes(flash_attn="3.0.0b1", cuda="12.4", ccs=((8, 0),)) == {"flash-attn-arch-unsupported"}
    assert codes(flash_attn="2.8.3", ccs=((8, 9),)) == set()


def test_flash_attn_kernels_follow_the_nvcc_that_builds_them():
    """setup.py adds sm_100 and sm_120 from 2.7.3 on, and only when nvcc >= 12.8; its cubins carry no PTX."""
    assert codes(flash_attn="2.8.3", torch="2.10.0+cu128", ccs=((12, 0),)) == set()
    assert codes(flash_attn="2.8.3", cuda="12.8", ccs=((12, 0),)) == set()
    assert codes(flash_attn="2.7.3", cuda="12.9", ccs=((10, 0),)) == set()
    assert "flash-attn-arch-unsupported" in codes(flash_attn="2.7.2", cuda="12.8", ccs=((12, 0),))
    assert "flash-attn-arch-unsupported" in codes(flash_attn="2.8.3", cuda="12.6", ccs=((12, 0),))
    assert "flash-attn-arch-unsupported" in codes(flash_attn="2.6.3", cuda="11.7", ccs=((9, 0),))
    assert codes(flash_attn="2.6.3", cuda="11.8", ccs=((9, 0),)) == set()


@given(st.sampled_from(["2.5.8", "2.7.4.post1", "2.8.3"]), st.sampled_from(["12.6", "12.8", "12.9", "13.0"]),
       st.sampled_from([(8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]))
def test_a_newer_nvcc_never_loses_flash_attn_kernels(release, cuda, cc):
    older = "flash-attn-arch-unsupported" in codes(flash_attn=release, cuda="12.4", ccs=(cc,))
    newer = "flash-attn-arch-unsupported" in codes(flash_attn=release, cuda=cuda, ccs=(cc,))
    assert older or not newer


def test_recipes_by_arch_and_fp8_flag():
    assert codes(ccs=((12, 0),), recipe="mxfp8", fp8=True) == {"te-recipe-unsupported"}
    assert codes(ccs=((10, 0),), recipe="mxfp8", fp8=True) == set()
    assert codes(ccs=((8, 6),), fp8=True) == {"fp8-unavailable"}
    assert codes(ccs=((8, 6),)) == set()


@given(st.sampled_from(["11.0", "11.4", "11.8", "12.0", "12.2", "12.8", "13.0"]))
def test_driver_as_torch_prints_it_is_that_cuda_s_lowest_driver(cuda):
    from gptforge.compat.facts import facts

    version = CudaVersion(*map(int, cuda.split(".")))
    reported = Combination(driver=str(version.encoded), torch_cuda=cuda)
    assert not codes(**reported.__dict__)  # a driver reporting CUDA X.Y runs CUDA X.Y
    assert parse_driver(str(version.encoded)).reports_cuda == version
    assert facts().toolkit_driver(version) is not None
