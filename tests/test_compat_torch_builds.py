"""A GPU against the builds of a torch release: the one given, PyPI's where none is, and every other build."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from gptforge.compat import Combination, check
from gptforge.compat.arches import ptx_runs_on, runs_on
from gptforge.compat.facts import facts
from gptforge.core.versions import parse_cuda

F = facts()
CCS = [(3, 5), (3, 7), (5, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]


def arch_findings(**fields) -> dict[str, str]:
    """code -> severity of the GPU-against-torch findings."""
    return {f.code: f.severity.value for f in check(Combination(**fields)) if f.code == "gpu-arch-not-in-torch"}


def test_a_gpu_only_other_builds_of_the_release_run_on_is_a_warning():
    """ivanvovk/WaveGrad#26: torch 1.7.0 runs on an RTX 3090; PyPI's 1.7.0 is the CUDA 10.2 build (no sm_80 or
    sm_86), its cu110 build has sm_80, which runs on 8.6."""
    found = check(Combination(torch="1.7.0", ccs=((8, 6),)))
    (finding,) = [f for f in found if f.code == "gpu-arch-not-in-torch"]
    assert finding.severity.value == "warning" and "torch==1.7.0+cu110" in finding.fix
    assert arch_findings(torch="2.0.1", ccs=((9, 0),)) == {"gpu-arch-not-in-torch": "warning"}  # cu118 has sm_90
    assert arch_findings(torch="1.7.0+cu102", ccs=((8, 6),)) == {"gpu-arch-not-in-torch": "error"}  # the build given


def test_a_gpu_no_build_of_the_release_runs_on_is_an_error():
    assert arch_findings(torch="1.13.1", ccs=((9, 0),)) == {"gpu-arch-not-in-torch": "error"}  # cu116, cu117: sm_86
    assert arch_findings(torch="1.3.1", ccs=((3, 5),)) == {"gpu-arch-not-in-torch": "error"}  # pytorch/pytorch#31319
    assert arch_findings(torch="1.2.0", ccs=((3, 0),)) == {"gpu-arch-not-in-torch": "error"}  # other lists unknown


def test_sm35_left_the_builds_after_1_3_0():
    """pytorch/builder 2aac90bd (2019-10-29) moved every build from sm_35 to sm_37: a K40 on any 1.3.1 to 1.6 build
    (pytorch/pytorch#30532: conda 1.3 for CUDA 10.1); 1.3.0's builds still carry sm_35."""
    for torch, cuda in (("1.3", "10.1"), ("1.3.1", "9.2"), ("1.4.0", "10.0"), ("1.5.1", "10.1"), ("1.6.0", "9.2")):
        assert arch_findings(torch=torch, torch_cuda=cuda, ccs=((3, 5),)) == {"gpu-arch-not-in-torch": "error"}
        assert arch_findings(torch=torch, torch_cuda=cuda, ccs=((3, 7),)) == {}
    assert arch_findings(torch="1.3.0", torch_cuda="10.1", ccs=((3, 5),)) == {}  # its list is not 1.3.1's
    assert arch_findings(torch="1.3.0", ccs=((3, 5),)) == {}  # PyPI's 1.3.0 wheel: sm_35


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(F.pypi_arches)), st.sampled_from(CCS))
def test_an_untagged_version_errs_only_where_no_recorded_build_runs_on_the_gpu(version, cc):
    sass, ptx = F.pypi_arches[version]
    top = max(a.cc for a in sass)
    if any(runs_on(a, cc) for a in sass) or any(ptx_runs_on(a, cc) for a in ptx if a.cc >= top) or cc < (3, 0):
        return
    release = F.torch.get(".".join(version.split(".")[:2]))
    if release is None:
        return
    builds = [b for b in release.variants if b.arches is not None and b.covers(Version(version))]
    other = any(any(runs_on(a, cc) for a in b.arches) or any(ptx_runs_on(a, cc) for a in b.ptx
                                                            if a.cc >= max(x.cc for x in b.arches)) for b in builds)
    expected = "warning" if other else "error"
    assert arch_findings(torch=version, ccs=(cc,)) == {"gpu-arch-not-in-torch": expected}


@given(st.integers(0, 9), st.integers(0, 9))
def test_a_patch_bounded_arch_list_holds_from_its_first_patch(patch, rc):
    (build,) = [b for b in F.torch["1.3"].variants if b.cuda.tag == "cu101"]
    assert build.covers(Version(f"1.3.{patch}")) == (patch >= 1)
    assert build.covers(Version("1.3"))  # the release as a whole: its newest builds
    assert build.covers(Version(f"1.3.{patch}rc{rc}")) == (patch >= 2)  # PEP 440: 1.3.1rc1 comes before 1.3.1


def test_torch_cuda_without_torch_errs_where_no_build_for_that_cuda_runs_on_the_gpu():
    """Kaggle/kaggle-cli#1151: a P100 (sm_60) with a torch for CUDA 12.8: the cu128 builds (2.7 onward) start at
    sm_70 or sm_75. A V100 runs the 2.8 to 2.10 cu128 builds but not 2.7's or 2.11's: which is installed decides."""
    assert arch_findings(torch_cuda="12.8", ccs=((6, 0),)) == {"gpu-arch-not-in-torch": "error"}
    assert arch_findings(torch_cuda="12.8", ccs=((7, 0),)) == {"gpu-arch-not-in-torch": "warning"}
    assert arch_findings(torch_cuda="12.8", ccs=((7, 5),)) == {}
    assert arch_findings(torch_cuda="12.6", ccs=((6, 0),)) == {}
    assert arch_findings(torch_cuda="12.9", ccs=((6, 0),)) == {}  # PyPI's cu129 lists are not recorded: not judged
    assert arch_findings(torch_cuda="11.8", ccs=((12, 0),)) == {"gpu-arch-not-in-torch": "error"}  # one finding


def _fully_recorded_cudas() -> list[str]:
    by_cuda: dict[str, list] = {}
    for release in F.torch.values():
        for build in release.variants:
            by_cuda.setdefault(str(build.cuda.release), []).append(build)
    return sorted(cuda for cuda, builds in by_cuda.items() if all(b.arches is not None for b in builds))


def _gpu_refused(**fields) -> bool:
    """Does the check call the GPU unable to run this torch (no kernels for it, or below every build's floor)?"""
    return any(f.severity.value == "error" and f.code in ("gpu-arch-not-in-torch", "gpu-too-old-for-torch")
               for f in check(Combination(**fields)))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_fully_recorded_cudas()), st.sampled_from(CCS))
def test_torch_cuda_alone_agrees_with_each_release_build_for_it(cuda, cc):
    """An error for a CUDA alone: every release's PyPI build for it, given with --torch, is refused too; silence:
    none is."""
    alone = arch_findings(torch_cuda=cuda, ccs=(cc,)).get("gpu-arch-not-in-torch")
    refused = [_gpu_refused(torch=f"{release.release}.0+{build.cuda.tag}", ccs=(cc,))
               for release in F.torch.values()
               if (build := release.variant(parse_cuda(cuda), "pypi")) is not None and build.versions is None]
    if alone == "error":
        assert all(refused)
    elif alone is None:
        assert not any(refused)
