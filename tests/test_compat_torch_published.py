"""A +cuXYZ torch build that was never published, where the table lists every CUDA build of its release."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from packaging.version import Version

from gptforge.compat import Combination, check
from gptforge.compat.facts import facts

F = facts()
COMPLETE = sorted(r for r, release in F.torch.items() if release.wheels_complete)
CUDAS = ["10.1", "10.2", "11.1", "11.3", "11.6", "11.7", "11.8", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0", "13.1",
         "13.2"]


def errors(torch: str) -> set[str]:
    return {f.code for f in check(Combination(torch=torch)) if f.severity.value == "error"}


def patches(release: str) -> list[str]:
    return sorted(v for v in F.torch_python if v.startswith(release + "."))


def test_an_unpublished_cuda_build_is_an_error():
    assert errors("2.1.0+cu117") == {"torch-build-unpublished"}
    assert errors("1.12.1+cu111") == {"torch-build-unpublished"}
    assert errors("2.1.0+cu121") == set()
    assert errors("2.6.0+cu121") == {"torch-build-unpublished"}  # the cu121 index stops at 2.5.1
    assert errors("2.5.1+cu121") == set()
    # 2.8 to 2.11: the stable and experimental columns of RELEASE.md's matrix (visualbruno/ComfyUI-Trellis2#131)
    assert errors("2.10.0+cu131") == {"torch-build-unpublished"}
    assert errors("2.10.0+cu130") == set()
    assert errors("2.8.0+cu129") == set() and errors("2.9.1+cu129") == set()  # cu129 beside the matrix, #187834
    assert errors("2.9.1+cu131") == {"torch-build-unpublished"}


def test_silent_where_the_table_may_lack_builds():
    assert "torch-build-unpublished" not in errors("2.12.0+cu117")  # release not marked complete (2.12.1 added cu129)
    assert "torch-build-unpublished" not in errors("2.2.0.dev20231010+cu117")  # a nightly
    assert "torch-build-unpublished" not in errors("2.3.9+cu117")  # a version PyPI never had
    assert "torch-build-unpublished" not in errors("2.1.0+cpu")


def test_complete_releases_have_their_patches_and_pypi_builds():
    assert COMPLETE
    for release in COMPLETE:
        assert patches(release)
        assert any(v.channel == "pypi" for v in F.torch[release].variants)


def test_complete_releases_list_the_build_pypi_serves():
    """A release's list is only taken as complete where it holds the CUDA build its PyPI wheels are (read from
    their METADATA), the check that caught RELEASE.md's 1.12 row lacking cu102."""
    for release in COMPLETE:
        published = {v.cuda.tag for v in F.torch[release].variants if v.channel == "pypi"}
        for version in patches(release):
            if (cuda := F.pypi_default_cuda(Version(version))) is not None:
                assert cuda.tag in published, (version, cuda.tag)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(COMPLETE), st.data(), st.sampled_from(CUDAS))
def test_unpublished_iff_the_cuda_is_not_among_the_release_builds(release, data, cuda):
    version = data.draw(st.sampled_from(patches(release)))
    published = {v.cuda.tag for v in F.torch[release].variants if v.channel == "pypi"}
    tag = "cu" + cuda.replace(".", "")
    assert ("torch-build-unpublished" in errors(f"{version}+{tag}")) == (tag not in published)
