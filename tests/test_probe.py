"""The probe against the real machine: real nvcc, the real libcudart, real compilers, NVML as it is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import LIBCUDART, NVCC, TOOLKIT, _real_nvcc_release, conda_like_prefix, needs_cudart, needs_nvcc
from gptforge.probe.compilers import probe_compiler
from gptforge.probe.cuda_home import probe_cuda_home
from gptforge.probe.cudart import format_runtime_version, runtime_version
from gptforge.probe.nvcc import cuda_home_setting, parse_nvcc_release, probe_nvcc, probe_nvcc_at
from gptforge.probe.nvml import probe_nvml
from gptforge.probe.torch_info import format_cudnn_version

@given(st.integers(0, 99), st.integers(0, 99), st.integers(0, 999))
def test_nvcc_release_parses_what_nvcc_prints(major, minor, build):
    text = f"nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release {major}.{minor}, V{major}.{minor}.{build}\n"
    assert parse_nvcc_release(text) == f"{major}.{minor}"


def test_nvcc_release_absent_is_none():
    assert parse_nvcc_release("bash: nvcc: command not found") is None


@given(st.integers(1, 99), st.integers(0, 9))
def test_runtime_version_encoding_round_trips(major, minor):
    assert format_runtime_version(major * 1000 + minor * 10) == f"{major}.{minor}"


@given(st.integers(9, 20), st.integers(0, 99), st.integers(0, 99))
def test_cudnn9_encoding_round_trips(major, minor, patch):
    assert format_cudnn_version(major * 10000 + minor * 100 + patch) == f"{major}.{minor}.{patch}"


def test_cudnn8_encoding():
    assert format_cudnn_version(8902) == "8.9.2"
    assert format_cudnn_version(None) is None


@needs_nvcc
def test_real_nvcc_version_and_toolkit_root():
    info = probe_nvcc_at(NVCC)
    assert info["error"] is None
    assert info["version"] == _real_nvcc_release()
    assert info["toolkit_root"] == os.path.realpath(TOOLKIT)
    assert info["host_compiler"]  # nvcc --dryrun names the host compiler it runs


def test_tools_printing_bytes_that_are_not_utf8_are_data(tmp_path):
    nvcc, cc = tmp_path / "nvcc", tmp_path / "cc"
    nvcc.write_text("#!/bin/sh\nprintf 'Cuda compilation tools, release 12.4, V12.4.131 \\377\\n'\n")
    cc.write_text("#!/bin/sh\nprintf 'gcc (GCC) \\377\\n'\n")
    nvcc.chmod(0o755)
    cc.chmod(0o755)
    assert probe_nvcc_at(str(nvcc))["version"] == "12.4"
    assert probe_compiler(str(cc), "CC")["kind"] == "gcc"


def test_missing_nvcc_is_data_not_an_exception(tmp_path):
    info = probe_nvcc_at(str(tmp_path / "bin" / "nvcc"))
    assert info["version"] is None and "does not exist" in info["error"]


@needs_nvcc
def test_nvcc_from_cuda_home_and_path_agree_on_one_toolkit():
    env = {"CUDA_HOME": TOOLKIT, "PATH": f"{TOOLKIT}/bin:/usr/bin:/bin"}
    info = probe_nvcc(env)
    assert info["cuda_home"]["version"] == info["path"]["version"] == _real_nvcc_release()
    assert info["agree"] is True


def test_cuda_home_order_follows_torch():
    assert cuda_home_setting({"CUDA_HOME": "/a", "CUDA_PATH": "/b"}) == ("/a", "CUDA_HOME")
    assert cuda_home_setting({"CUDA_PATH": "/b"}) == ("/b", "CUDA_PATH")


@needs_nvcc
def test_cuda_home_guessed_from_nvcc_on_path():
    path, source = cuda_home_setting({"PATH": f"{TOOLKIT}/bin"})
    assert (path, source) == (TOOLKIT, "nvcc on PATH")


@needs_cudart
def test_real_libcudart_reports_its_runtime_version():
    encoded = runtime_version(LIBCUDART)
    assert encoded is not None
    assert format_runtime_version(encoded) == _real_nvcc_release()  # the toolkit's runtime = its nvcc release


@needs_cudart
def test_cuda_13_libcudart_reports_13000():
    if _real_nvcc_release() != "13.0":
        pytest.skip("the toolkit here is not CUDA 13.0")
    assert runtime_version(LIBCUDART) == 13000


def test_runtime_version_of_a_non_library_is_none(tmp_path):
    (tmp_path / "libcudart.so").write_text("not an ELF file")
    assert runtime_version(str(tmp_path / "libcudart.so")) is None


@needs_cudart
def test_loaded_libcudart_is_found_in_the_process_maps():
    code = (
        "import ctypes, json, sys; ctypes.CDLL(sys.argv[1]);"
        "from gptforge.probe.cudart import probe_loaded_libcudart; print(json.dumps(probe_loaded_libcudart()))"
    )
    out = subprocess.run([sys.executable, "-c", code, LIBCUDART], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert [lib["real_path"] for lib in loaded] == [os.path.realpath(LIBCUDART)]
    assert loaded[0]["version"] == _real_nvcc_release()


def test_no_libcudart_mapped_in_a_plain_process():
    code = "import json; from gptforge.probe.cudart import mapped_libcudart; print(json.dumps(mapped_libcudart()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


@needs_cudart
def test_conda_like_layout_is_described(tmp_path):
    root = conda_like_prefix(tmp_path / "env", TOOLKIT)
    info = probe_cuda_home({"CUDA_HOME": str(root), "PATH": os.environ.get("PATH", "")})
    assert info["exists"] and info["source"] == "CUDA_HOME"
    assert info["lib64"] is None and info["lib"] is True
    assert info["headers_only_in_targets"] is True
    assert info["libcudart"]["version"] == _real_nvcc_release()


def test_nonexistent_cuda_home_is_data(tmp_path):
    info = probe_cuda_home({"CUDA_HOME": str(tmp_path / "nope")})
    assert info["exists"] is False and info["path"] == str(tmp_path / "nope")


def test_unreadable_cuda_home_is_data(tmp_path):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    root.chmod(0)
    try:
        if os.access(root, os.R_OK | os.X_OK):
            pytest.skip("this user reads any directory (root)")
        info = probe_cuda_home({"CUDA_HOME": str(root)})
        assert info["exists"] is True and info["readable"] is False
    finally:
        root.chmod(0o755)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on PATH")
def test_gcc_version_matches_dumpfullversion():
    info = probe_compiler("gcc", "PATH")
    want = subprocess.run(["gcc", "-dumpfullversion", "-dumpversion"], capture_output=True, text=True).stdout.strip()
    assert info["kind"] == "gcc" and info["version"] == want


def test_missing_compiler_is_data():
    info = probe_compiler("g++-does-not-exist", "CXX")
    assert info["path"] is None and info["version"] is None


def test_nvml_answers_without_raising():
    info = probe_nvml()
    assert info["status"] in {"ok", "no-driver", "error"}
    if info["status"] == "ok":
        assert info["driver_version"] and info["cuda_version"]
        for gpu in info["gpus"]:
            assert gpu["memory_total_mib"] >= gpu["memory_free_mib"] >= 0
    elif info["status"] == "no-driver":
        assert "no NVIDIA driver found" in info["error"] and info["gpus"] == []
