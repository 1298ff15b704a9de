"""NVIDIA's PyPI wheel layout (site-packages/nvidia/cu13/{bin,include,lib}: libcudart.so.13 a regular
file, no libcudart.so, no lib64) made a usable CUDA_HOME by fix-links, proven by real builds:

* a CUDA extension built by torch.utils.cpp_extension with the prefix's nvcc (fails before the
  repair with "cannot find -lcudart"; after it, it links and reports the wheel's runtime version);
* DeepSpeed's op-builder flags (g++ -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart);
* apex's check, ``$CUDA_HOME/bin/nvcc -V``.

The default test lays the toolkit's real files out as the wheels do; the ``slow`` one installs the
real wheels from PyPI. A CPU build of torch has no CUDA parts to link (libc10_cuda, libtorch_cuda)
and skips its own CUDA_HOME discovery: the build script runs torch's ``_find_cuda_home`` itself and
gives the linker empty stand-ins for those two libraries (dropped again by --as-needed: the
extension does not use them). The CUDA side of the build is all real.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import run_cli, toolkit_dir
from gptforge.links.elf import read_soname

KERNEL = r"""
#include <cuda_runtime.h>
__global__ void add_one(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" int runtime_version() { int v = 0; return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : -1; }
"""

BUILD = r"""
import ctypes, os, sys
from torch.utils import cpp_extension
cpp_extension.CUDA_HOME = cpp_extension.CUDA_HOME or cpp_extension._find_cuda_home()
src, build, stubs = sys.argv[1:4]
cpp_extension.load("wheelprobe", [src], build_directory=build, is_python_module=False,
                   extra_ldflags=["-Wl,--as-needed", f"-L{stubs}"])
print("runtime", ctypes.CDLL(os.path.join(build, "wheelprobe.so")).runtime_version())
"""

PYPI_WHEELS = ["nvidia-cuda-runtime==13.0.96", "nvidia-cuda-nvcc==13.0.88",
               # nvcc 13.0.88 requires crt and nvvm without a version; a resolver would take 13.5
               "nvidia-cuda-crt==13.0.*", "nvidia-nvvm==13.0.*"]


def _place(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)  # the toolkit is large; fix-links never writes to regular files
    except OSError:
        shutil.copy2(src, dst)


def _tree(src: str, dst: str) -> None:
    for root, _dirs, files in os.walk(src, followlinks=True):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                _place(os.path.realpath(path), os.path.join(dst, os.path.relpath(path, src)))


def wheel_layout_from_toolkit(venv: str) -> str:
    """The toolkit's real files arranged as NVIDIA's wheels install them; returns the cu<major> root.
    Libraries keep only their real files, each under its SONAME (``libcudart.so.13``)."""
    home = os.path.realpath(toolkit_dir())
    nvcc = os.path.join(home, "bin", "nvcc")
    libdir = next((d for d in (os.path.join(home, "lib64"), os.path.join(home, "lib")) if os.path.isdir(d)), None)
    if not os.access(nvcc, os.X_OK) or libdir is None or not os.path.isdir(os.path.join(home, "nvvm")):
        pytest.skip(f"needs a CUDA toolkit with bin/nvcc, lib and nvvm under {home}")
    runtime = [p for p in glob.glob(os.path.join(libdir, "libcudart.so.*")) if not os.path.islink(p)]
    if not runtime:
        pytest.skip(f"no real libcudart under {libdir}")
    major = read_soname(runtime[0]).rsplit(".", 1)[1]
    root = os.path.join(venv, "lib", f"python3.{sys.version_info.minor}", "site-packages", "nvidia", f"cu{major}")
    for sub in ("bin", "include", "nvvm"):
        _tree(os.path.join(home, sub), os.path.join(root, sub))
    for name in os.listdir(libdir):
        path = os.path.join(libdir, name)
        if os.path.isfile(path) and not os.path.islink(path) and (".so" in name or name.endswith(".a")):
            _place(path, os.path.join(root, "lib", read_soname(path) or name))
    return root


def wheel_layout_from_pypi(venv: str, cache: str) -> str:
    """The real wheels, downloaded once into ``cache`` and installed with pip into ``venv``."""
    if not glob.glob(os.path.join(cache, "nvidia_cuda_nvcc-13.0.88-*.whl")):
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                              "-d", cache, *PYPI_WHEELS], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            pytest.skip(f"cannot download the CUDA 13.0 wheels: {out.stderr.strip()[-300:]}")
    wheels = glob.glob(os.path.join(cache, "*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--prefix", venv,
                    *wheels], check=True, capture_output=True, timeout=600)
    return os.path.join(venv, "lib", f"python3.{sys.version_info.minor}", "site-packages", "nvidia", "cu13")


def _torch_cuda_stand_ins(workdir) -> str:
    """Empty libc10_cuda/libtorch_cuda for a CPU build of torch (see the module docstring)."""
    import torch

    stubs = workdir / "torch-cuda-stand-ins"
    stubs.mkdir()
    if not os.path.exists(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")):
        (stubs / "empty.c").write_text("")
        for name in ("libc10_cuda.so", "libtorch_cuda.so"):
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stubs / name), str(stubs / "empty.c")], check=True)
    return str(stubs)


def _cpp_extension_build(cuda_home: str, workdir, stubs: str, attempt: str) -> subprocess.CompletedProcess:
    src = workdir / "probe.cu"
    src.write_text(KERNEL)
    build = workdir / f"build-{attempt}"
    build.mkdir()
    env = {**os.environ, "CUDA_HOME": cuda_home, "PATH": f"{cuda_home}/bin:{os.environ.get('PATH', '')}",
           "LD_LIBRARY_PATH": os.path.join(cuda_home, "lib64"), "TORCH_CUDA_ARCH_LIST": "8.0", "MAX_JOBS": "1",
           "TORCH_EXTENSIONS_DIR": str(workdir / "ext")}
    return subprocess.run([sys.executable, "-c", BUILD, str(src), str(build), stubs],
                          capture_output=True, text=True, env=env, timeout=600)


def _deepspeed_flags_build(cuda_home: str, workdir) -> subprocess.CompletedProcess:
    src = workdir / "ds.cpp"
    src.write_text("#include <cuda_runtime.h>\nint main() { int v = 0; return cudaRuntimeGetVersion(&v); }\n")
    return subprocess.run(["g++", str(src), f"-I{cuda_home}/include", f"-L{cuda_home}/lib64", "-lcudart",
                           "-o", str(workdir / "ds")], capture_output=True, text=True)


def _proves_usable_cuda_home(venv: str, workdir) -> None:
    if shutil.which("g++") is None or not _has_ninja_module():
        pytest.skip("g++ and ninja are needed for torch.utils.cpp_extension")
    found = run_cli("fix-links", "--print-cuda-home", "--prefix", venv)
    assert found.returncode == 0, found.stderr
    home = found.stdout.strip()
    assert home.endswith(os.path.join("site-packages", "nvidia", "cu13"))
    stubs = _torch_cuda_stand_ins(workdir)
    assert not os.path.lexists(os.path.join(home, "lib", "libcudart.so"))
    assert not os.path.lexists(os.path.join(home, "lib64"))

    before = _cpp_extension_build(home, workdir, stubs, "before")
    assert before.returncode != 0 and "cannot find -lcudart" in before.stderr + before.stdout, before.stderr[-2000:]
    assert _deepspeed_flags_build(home, workdir).returncode != 0

    fixed = run_cli("fix-links", "--prefix", home, "--json")  # no --cuda: the prefix's own nvcc says which
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    report = json.loads(fixed.stdout)
    assert report["cuda"] == "13.0" and report["cuda_source"] == "bin/nvcc --version: release 13.0"

    after = _cpp_extension_build(home, workdir, stubs, "after")
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout.split()[-2:] == ["runtime", "13000"]
    assert _deepspeed_flags_build(home, workdir).returncode == 0
    apex = subprocess.run([os.path.join(home, "bin", "nvcc"), "-V"], capture_output=True, text=True)
    assert "release 13.0" in apex.stdout


def _has_ninja_module() -> bool:
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except ImportError:
        return False
    return is_ninja_available()


def test_wheel_layout_from_the_toolkit_builds_a_cuda_extension(tmp_path):
    venv = str(tmp_path / "venv")
    wheel_layout_from_toolkit(venv)
    _proves_usable_cuda_home(venv, tmp_path)


@pytest.mark.slow
def test_real_pypi_wheels_build_a_cuda_extension(tmp_path, request):
    venv = str(tmp_path / "venv")
    wheel_layout_from_pypi(venv, str(request.config.cache.mkdir("links-cuda13-wheels")))
    _proves_usable_cuda_home(venv, tmp_path)
