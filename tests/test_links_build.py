"""What the repair is for, with the real compiler: build a program the way DeepSpeed's async_io op
builder does (host g++, -I$CUDA_HOME/include, -L$CUDA_HOME/lib64 -lcudart) against a conda-forge
shaped prefix used as CUDA_HOME. It fails before fix-links and builds and runs after it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import run_cli, symlink, toolkit_cudart, toolkit_dir, write

PROGRAM = r"""
#include <cstdio>
#include <cuda_runtime.h>
int main() { int v = 0; cudaError_t rc = cudaRuntimeGetVersion(&v); std::printf("%d %d\n", (int)rc, v); return rc; }
"""


@pytest.fixture
def conda_shaped_prefix(tmp_path):
    """Headers and the runtime under targets/x86_64-linux only; lib has the runtime's SONAME link
    (a runtime-only install: no libcudart.so); include/ holds another package's header; no lib64."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed")
    real, number = toolkit_cudart()
    headers = os.path.join(toolkit_dir(), "include")
    if not os.path.isfile(os.path.join(headers, "cuda_runtime.h")):
        pytest.skip(f"no CUDA headers under {headers}")
    major, minor = number // 1000, number % 1000 // 10
    prefix = tmp_path / "env"
    target = prefix / "targets" / "x86_64-linux"
    shutil.copytree(headers, target / "include", symlinks=False)
    (target / "lib").mkdir(parents=True)
    name = f"libcudart.so.{major}.{minor}.0"
    shutil.copyfile(real, target / "lib" / name)
    symlink(f"../targets/x86_64-linux/lib/{name}", str(prefix / "lib" / name))
    symlink(name, str(prefix / "lib" / f"libcudart.so.{major}"))
    write(str(prefix / "include" / "Python.h"), b"/* another package's header */\n")
    return str(prefix), f"{major}.{minor}", number


def _build_like_deepspeed(cuda_home: str, workdir) -> subprocess.CompletedProcess:
    src = workdir / "probe.cpp"
    src.write_text(PROGRAM)
    return subprocess.run(["g++", str(src), f"-I{cuda_home}/include", f"-L{cuda_home}", f"-L{cuda_home}/lib64",
                           "-lcudart", "-o", str(workdir / "probe")], capture_output=True, text=True)


def test_cuda_home_prefix_builds_after_the_repair(conda_shaped_prefix, tmp_path):
    prefix, cuda, number = conda_shaped_prefix
    before = _build_like_deepspeed(prefix, tmp_path)
    assert before.returncode != 0 and "cuda_runtime.h" in before.stderr

    out = run_cli("fix-links", "--prefix", prefix, "--cuda", cuda)
    assert out.returncode == 0, out.stdout + out.stderr

    after = _build_like_deepspeed(prefix, tmp_path)
    assert after.returncode == 0, after.stderr
    env = {**os.environ, "LD_LIBRARY_PATH": os.path.join(prefix, "lib64")}
    ran = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, env=env)
    assert ran.stdout.split() == ["0", str(number)]


def test_lib64_alone_is_what_the_linker_needed(conda_shaped_prefix, tmp_path):
    """With the headers given directly, the only failure left is DeepSpeed's: no lib64."""
    prefix, cuda, _ = conda_shaped_prefix
    src = tmp_path / "probe.cpp"
    src.write_text(PROGRAM)
    argv = ["g++", str(src), f"-I{prefix}/targets/x86_64-linux/include", f"-L{prefix}/lib64", "-lcudart",
            "-o", str(tmp_path / "probe")]
    before = subprocess.run(argv, capture_output=True, text=True)
    assert before.returncode != 0 and "cannot find -lcudart" in before.stderr
    assert run_cli("fix-links", "--prefix", prefix, "--cuda", cuda).returncode == 0
    assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
