"""Prebuilt wheels as input: what a wheel was built for (torch, CUDA major, C++ ABI, Python), judged.

The file names are real ones users installed, as their reports quote them.
"""

from __future__ import annotations

import json
import sys
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.cli import main
from gptforge.compat import Combination, CudaVersion, Severity, VersionError, check
from gptforge.compat.wheels import installed_builds, parse_wheel_name, read_wheel

FA_853_TRUE = "flash_attn-2.5.5+cu118torch2.2cxx11abiTRUE-cp38-cp38-linux_x86_64.whl"  # flash-attention#853
FA_1783 = "flash_attn-2.8.2+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"  # flash-attention#1783
FA_954 = "flash_attn-2.5.8+cu122torch2.3cxx11abiTRUE-cp310-cp310-linux_x86_64.whl"  # flash-attention#954
TE_1553 = "transformer_engine_cu12-1.13.0-py3-none-manylinux_2_28_x86_64.whl"  # TransformerEngine#1553


def errors(**fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity is Severity.ERROR}


def test_the_name_states_torch_cuda_abi_and_python():
    build = parse_wheel_name(FA_853_TRUE)
    assert (build.project, build.version.public) == ("flash-attn", "2.5.5")
    assert (build.torch, build.cuda.release, build.cuda_major, build.cxx11_abi) == ((2, 2), CudaVersion(11, 8), 11, True)
    assert {t.interpreter for t in build.tags} == {"cp38"}
    cu12 = parse_wheel_name(FA_1783)
    assert (cu12.cuda, cu12.cuda_major, cu12.torch, cu12.cxx11_abi) == (None, 12, (2, 6), False)


def test_transformer_engine_core_wheel_names_its_cuda_major():
    build = parse_wheel_name(TE_1553)
    assert (build.project, build.cuda_major, build.torch) == ("transformer-engine-cu12", 12, None)
    assert "wheel-cuda-mismatch" in errors(torch="2.5.1+cu118", wheels=(TE_1553,))
    assert "wheel-cuda-mismatch" not in errors(torch="2.5.1+cu124", wheels=(TE_1553,))


def test_a_wheel_for_another_torch_minor_cuda_major_abi_or_python_is_an_error():
    # the name matches torch 2.6.0+cu124, but 2.8.2's torch2.6 wheels were compiled against the C++11-ABI cu126 build
    assert errors(torch="2.6.0+cu124", python="3.11", wheels=(FA_1783,)) == {"wheel-abi-mismatch"}
    assert errors(torch="2.6.0+cu124", python="3.11", wheels=(FA_1783.replace("2.8.2", "2.7.4.post1"),)) == set()
    assert errors(torch="2.5.1+cu124", wheels=(FA_1783,)) == {"wheel-torch-mismatch"}
    assert errors(torch="2.6.0+cu118", wheels=(FA_1783,)) == {"wheel-cuda-mismatch", "wheel-abi-mismatch"}
    assert errors(torch="2.2.0+cu118", wheels=(FA_853_TRUE,)) == {"wheel-abi-mismatch"}
    assert errors(torch="2.6.0+cu124", python="3.12", wheels=(FA_1783,)) == {"wheel-python-mismatch",
                                                                            "wheel-abi-mismatch"}


def test_an_abi_the_tables_do_not_know_is_not_checked_not_ok():
    """torch 2.13 for CUDA 12.9 is a conda-forge build: torch_abi.toml holds the PyPI builds' ABI only."""
    wheel = "flash_attn-2.8.3+cu12torch2.13cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    findings = check(Combination(torch="2.13.0", torch_cuda="12.9", wheels=(wheel,)))
    assert not [f for f in findings if f.severity is Severity.ERROR]
    assert any(f.code == "not-checked" and "C++ ABI of torch 2.13.0" in f.message for f in findings)


def test_torch_2_3_wheels_use_the_pre_cxx11_abi():
    assert errors(torch="2.3.0+cu121", wheels=(FA_954,)) == {"wheel-abi-mismatch"}


def test_a_wheel_version_stands_for_the_project_and_needs_no_nvcc():
    """flash-attn 2.5.5's nvcc floor (11.6) is for source builds; its GPU floor still applies."""
    fa = "flash_attn-2.5.5+cu118torch2.2cxx11abiFALSE-cp38-cp38-linux_x86_64.whl"
    assert "flash-attn-unsupported" not in errors(torch="2.2.0+cu118", cuda="11.5", wheels=(fa,))
    assert "flash-attn-arch-unsupported" in errors(torch="2.2.0+cu118", ccs=((7, 0),), wheels=(fa,))


def test_a_wheel_file_is_read_for_its_metadata(tmp_path):
    path = tmp_path / FA_1783
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("flash_attn-2.8.2.dist-info/METADATA",
                       "Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.2\nRequires-Dist: torch==2.6.0\n")
    build = read_wheel(str(path))
    assert (build.torch, build.torch_pin) == ((2, 6), "==2.6.0")


def test_a_file_that_is_no_wheel_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / FA_1783
    bad.write_text("not a zip")
    with pytest.raises(VersionError, match="not a readable wheel"):
        read_wheel(str(bad))
    with pytest.raises(SystemExit) as stop:
        main(["compat", "check", "--wheel", str(bad)])
    assert stop.value.code == 2
    assert "not a readable wheel" in capsys.readouterr().err


def test_cli_judges_a_wheel_name(capsys):
    code = main(["compat", "check", "--torch", "2.2.0+cu118", "--wheel", FA_853_TRUE, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == ["wheel-abi-mismatch"]
    assert "cxx11abiFALSE" in report["findings"][0]["fix"]


def test_installed_distributions_are_read_through_importlib_metadata(tmp_path, monkeypatch):
    """doctor's view: the wheel name pip recorded in direct_url.json, else the version's local tag."""
    fa = tmp_path / "flash_attn-2.5.5.dist-info"
    fa.mkdir()
    (fa / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.5.5\n")
    url = "https://github.com/Dao-AILab/flash-attention/releases/download/v2.5.5/" + FA_853_TRUE
    (fa / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))
    te = tmp_path / "transformer_engine_cu12-1.13.0.dist-info"
    te.mkdir()
    (te / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer_engine_cu12\nVersion: 1.13.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    builds = {b.project: b for b in installed_builds()}
    assert builds["flash-attn"].cxx11_abi is True and builds["flash-attn"].torch == (2, 2)
    assert builds["transformer-engine-cu12"].cuda_major == 12
    assert errors(torch="2.2.0+cu118", wheels=tuple(builds.values())) == {"wheel-abi-mismatch", "wheel-cuda-mismatch",
                                                                          "te-unsupported"}


def test_torch_style_cuda_tags_are_read_as_torch_reads_them():
    """torch's own wheels name the full CUDA (cu92, cu121); flash-attn's only the major (cu12).

    Both names are listed by https://download.pytorch.org/whl/torch/ (and quoted in users' install notes)."""
    assert parse_wheel_name("torch-2.1.0+cu121-cp310-cp310-linux_x86_64.whl").cuda == CudaVersion(12, 1)
    assert parse_wheel_name("torch-1.7.1+cu92-cp38-cp38-linux_x86_64.whl").cuda == CudaVersion(9, 2)


FA_KIMI_56 = "flash_attn-2.7.4.post1+cu12torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"  # Kimi-Audio#56


def _wheel_torch_severity(torch: str, wheel: str) -> Severity | None:
    found = [f.severity for f in check(Combination(torch=torch, wheels=(wheel,))) if f.code == "wheel-torch-mismatch"]
    return found[0] if found else None


def test_a_wheel_for_an_older_torch_minor_fails_only_across_a_recorded_symbol_change():
    """The torch 2.3 wheel runs on torch 2.4.1 (Kimi-Audio#56); one for 2.2 does not load on 2.3 (SetDevice(int) is
    gone: flash-attention#931); one for a newer minor than torch's is always an error."""
    assert _wheel_torch_severity("2.4.1", FA_KIMI_56) is Severity.WARNING
    assert _wheel_torch_severity("2.3.1", FA_KIMI_56.replace("torch2.3", "torch2.2")) is Severity.ERROR
    assert _wheel_torch_severity("2.5.1", FA_KIMI_56.replace("torch2.3", "torch2.1")) is Severity.ERROR
    assert _wheel_torch_severity("2.2.2", FA_KIMI_56) is Severity.ERROR
    assert _wheel_torch_severity("2.3.1", FA_KIMI_56) is None


MINORS = [(2, minor) for minor in range(0, 10)]


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(MINORS), st.sampled_from(MINORS), st.sampled_from(MINORS))
def test_a_wheel_that_fails_on_a_torch_fails_on_every_later_one(built, have, later):
    """What a torch release changed stays changed: an error for (built, have) is an error for any later torch; a wheel
    is an error on every torch older than the one it was built for."""
    have, later = sorted([have, later])
    wheel = FA_KIMI_56.replace("torch2.3", f"torch{built[0]}.{built[1]}")
    first = _wheel_torch_severity(f"{have[0]}.{have[1]}.0", wheel)
    if first is Severity.ERROR and built < have:
        assert _wheel_torch_severity(f"{later[0]}.{later[1]}.0", wheel) is Severity.ERROR
    if built > have:
        assert first is Severity.ERROR
    if built == have:
        assert first is None
