"""torch's runtime compilers (TorchScript fuser, jiterator) against the nvrtc of its CUDA: torch.toml's
[[nvrtc_arch_cap]] rows say up to which nvrtc each release caps the GPU's arch at what that nvrtc knows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.compat import Combination, Severity, check
from gptforge.compat.facts import facts

F = facts()
# (torch release, CUDA) of every download.pytorch.org build in the tables from 1.0 on
BUILDS = sorted({(release, f"{v.cuda.major}.{v.cuda.minor}") for release, row in F.torch.items()
                 for v in row.variants if v.channel == "pypi" and release[0] != "0"},
                key=lambda b: tuple(int(p) for p in b[0].split(".")))
GPUS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)]


def findings(**fields) -> dict[str, Severity]:
    return {f.code: f.severity for f in check(Combination(**fields))}


def test_an_rtx_30_gpu_on_a_cuda_11_0_torch_1_7_0_gets_an_arch_nvrtc_11_0_lacks():
    """WisconsinAIVision/yolact_edge#107: 'nvrtc: error: invalid value for --gpu-architecture (-arch)'."""
    found = findings(torch="1.7.0", torch_cuda="11.0", ccs=((8, 6),))
    assert found["nvrtc-arch-unsupported"] is Severity.WARNING
    assert "gpu-arch-not-in-torch" not in found  # its sm_80 cubins run on 8.6
    assert "nvrtc-arch-unsupported" not in findings(torch="1.7.1", torch_cuda="11.0", ccs=((8, 6),))
    assert "nvrtc-arch-unsupported" not in findings(torch="1.7.0", torch_cuda="11.0", ccs=((8, 0),))


def test_ada_needs_the_1_13_cap_or_an_nvrtc_of_11_8():
    """Improbable-AI/walk-these-ways#72 (RTX 4090, torch 1.10.0+cu113); pytorch#87618 caps nvrtc 11.1-11.7 at sm_86."""
    fix = next(f.fix for f in check(Combination(torch="1.10.0+cu113", ccs=((8, 9),)))
               if f.code == "nvrtc-arch-unsupported")
    assert "torch >= 1.13" in fix and "CUDA >= 11.8" in fix
    assert "nvrtc-arch-unsupported" in findings(torch="1.12.1+cu116", ccs=((8, 9),))
    assert "nvrtc-arch-unsupported" not in findings(torch="1.13.0+cu116", ccs=((8, 9),))
    assert "nvrtc-arch-unsupported" not in findings(torch="2.0.1+cu118", ccs=((8, 9),))


def test_a_gpu_of_a_newer_major_is_left_to_the_missing_kernels_finding():
    found = findings(torch="1.12.1+cu113", ccs=((9, 0),))
    assert "nvrtc-arch-unsupported" not in found and "gpu-arch-not-in-torch" in found


def _nvrtc_fails(release: str, cuda: str, cc: tuple[int, int]) -> bool:
    torch = f"{release}.0+cu{cuda.replace('.', '')}"
    return "nvrtc-arch-unsupported" in findings(torch=torch, ccs=(cc,))


@settings(max_examples=examples(40), deadline=None)
@given(st.sampled_from(BUILDS), st.sampled_from(BUILDS), st.sampled_from(GPUS))
def test_a_later_release_caps_at_least_what_an_earlier_one_did(first, second, cc):
    """The cap tables only grow: for one CUDA and GPU, a later torch release never fails where an earlier one runs."""
    (old, cuda), (new, _) = sorted([first, second], key=lambda b: tuple(int(p) for p in b[0].split(".")))
    if not any(b == (new, cuda) for b in BUILDS):
        return
    if not _nvrtc_fails(old, cuda, cc):
        assert not _nvrtc_fails(new, cuda, cc)


@settings(max_examples=examples(40), deadline=None)
@given(st.sampled_from(BUILDS), st.sampled_from(GPUS))
def test_an_nvrtc_that_knows_the_gpu_never_fails(build, cc):
    release, cuda = build
    targetable = F.targetable(next(v.cuda for v in F.torch[release].variants if f"{v.cuda.major}.{v.cuda.minor}" == cuda))
    if any(a.cc == cc and not a.suffix for a in targetable):
        assert not _nvrtc_fails(release, cuda, cc)
