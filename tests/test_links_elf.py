"""The SONAME reader against gcc-built libraries, the real toolkit's libraries and readelf."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from gptforge.links.elf import read_soname
from conftest import examples, fake_library


def _readelf_soname(path: str) -> str | None:
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[(.*)\]", out)
    return m.group(1) if m else None


@pytest.mark.parametrize("soname", ["libcudart.so.13", "libcudart.so.11.0", "libcudnn_ops.so.9", "libx.so.1"])
def test_gcc_built_library(soname):
    assert read_soname(fake_library(soname, 12080)) == soname


def test_real_toolkit_libraries_agree_with_readelf():
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) not installed")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    libs = sorted(p for p in glob.glob(os.path.join(cuda, "lib*", "lib*.so*")) if not os.path.islink(p))
    libs += sorted(glob.glob("/lib/x86_64-linux-gnu/libc.so.6"))
    if not libs:
        pytest.skip(f"no CUDA toolkit libraries under {cuda} (set CUDA_HOME)")
    for path in libs:
        assert read_soname(path) == _readelf_soname(path), path


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=600))
def test_garbage_is_not_a_library(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("elf") / "libjunk.so.1"
    path.write_bytes(data)
    assert read_soname(str(path)) is None


@settings(max_examples=examples(100), deadline=None)
@given(cut=st.integers(min_value=0, max_value=16000))
def test_truncated_library_never_raises(tmp_path_factory, cut):
    whole = open(fake_library("libcut.so.3", 1), "rb").read()
    path = tmp_path_factory.mktemp("elf") / "libcut.so.3"
    path.write_bytes(whole[:cut])
    assert read_soname(str(path)) in (None, "libcut.so.3")
