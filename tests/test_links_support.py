"""Helpers for the fix-links tests: real ELF libraries built with gcc, prefix snapshots.

(No tests here; the other test_links_* modules import it.)
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

import pytest

_LIB_CACHE = tempfile.mkdtemp(prefix="gptforge-links-libs-")
atexit.register(shutil.rmtree, _LIB_CACHE, ignore_errors=True)
_SOURCE = "int cudaRuntimeGetVersion(int *v) {{ *v = {number}; return 0; }}\n"


def fake_library(soname: str, runtime_number: int) -> str:
    """A real shared library (gcc) with SONAME ``soname`` whose cudaRuntimeGetVersion reports
    ``runtime_number``. Cached per (soname, number); copy it into a prefix, never link to it."""
    out = os.path.join(_LIB_CACHE, f"{soname}-{runtime_number}.so")
    return _built_library(out, soname, _SOURCE.format(number=runtime_number))


def _built_library(out: str, soname: str, source: str) -> str:
    """``out``, compiled by gcc from C ``source`` with SONAME ``soname`` unless it is cached."""
    if not os.path.exists(out):
        if shutil.which("gcc") is None:
            pytest.skip("gcc is needed to build test libraries")
        src = out + ".c"
        with open(src, "w") as f:
            f.write(source)
        tmp = out + ".tmp"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", tmp, src], check=True)
        os.replace(tmp, out)
    return out


# The version functions NVIDIA's libraries export, with their documented signatures (see
# gptforge.links.libversion): a library built from one of these answers like the real one.
_ABI_SOURCE = {
    "runtime": "int {symbol}(int *v) {{ *v = {major} * 1000 + {minor} * 10; return 0; }}\n",
    "major-minor": "int {symbol}(int *a, int *b) {{ *a = {major}; *b = {minor}; return 0; }}\n",
    "property": "int {symbol}(int t, int *v) {{ int p[3] = {{{major}, {minor}, {patch}}}; "
                "if (t < 0 || t > 2) return 7; *v = p[t]; return 0; }}\n",
}


def versioned_library(soname: str, symbol: str, abi: str, version: tuple[int, int, int]) -> str:
    """A real shared library with SONAME ``soname`` whose ``symbol`` reports ``version`` through ``abi``.
    Cached; copy it into a prefix, never link to it."""
    out = os.path.join(_LIB_CACHE, f"{soname}-{symbol}-{'.'.join(map(str, version))}.so")
    source = _ABI_SOURCE[abi].format(symbol=symbol, major=version[0], minor=version[1], patch=version[2])
    return _built_library(out, soname, source)


def runtime_number(version: tuple[int, ...]) -> int:
    return version[0] * 1000 + version[1] * 10


def snapshot(prefix: str) -> dict[str, tuple]:
    """Every name under ``prefix`` -> ('link', text) | ('file', sha256) | ('dir',) | ('other',)."""
    out: dict[str, tuple] = {}
    for root, dirs, files in os.walk(prefix):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, prefix)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir",)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = ("other",)
    return out


def dangling(prefix: str) -> set[str]:
    snap = snapshot(prefix)
    return {rel for rel, kind in snap.items() if kind[0] == "link" and not os.path.exists(os.path.join(prefix, rel))}


def regular_files(snap: dict) -> dict:
    return {rel: kind for rel, kind in snap.items() if kind[0] in ("file", "dir")}


def without_state(snap: dict) -> dict:
    """The snapshot without gptforge's own undo-record directory."""
    return {rel: kind for rel, kind in snap.items() if not rel.startswith(".gptforge")}


def write(path: str, data: bytes = b"not a library\n") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def symlink(target: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def install_library(prefix: str, stem: str, version: tuple[int, ...], *, place: str = "target",
                    soname_major: int | None = None) -> str:
    """Put a real ``stem.so.<version>`` into the prefix the way conda-forge does: the file under
    targets/x86_64-linux/lib and a full-name link in lib (``place='target'``), or the file in lib."""
    name = f"{stem}.so.{'.'.join(map(str, version))}"
    soname = f"{stem}.so.{soname_major if soname_major is not None else version[0]}"
    lib = fake_library(soname, runtime_number(version))
    if place == "target":
        dest = os.path.join(prefix, "targets", "x86_64-linux", "lib", name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(lib, dest)
        if not os.path.lexists(os.path.join(prefix, "lib", name)):
            symlink(f"../targets/x86_64-linux/lib/{name}", os.path.join(prefix, "lib", name))
    else:
        dest = os.path.join(prefix, "lib", name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(lib, dest)
    return dest


def toolkit_dir() -> str:
    """The CUDA toolkit the tests take real files from: $CUDA_HOME, else /usr/local/cuda."""
    return os.environ.get("CUDA_HOME", "/usr/local/cuda")


def toolkit_cudart() -> tuple[str, int]:
    """(path, cudaRuntimeGetVersion) of the toolkit's real libcudart; skips the test without one."""
    from gptforge.links.verify import load_versions

    cuda = toolkit_dir()
    found = [p for p in glob.glob(os.path.join(cuda, "lib*", "libcudart.so.*")) if not os.path.islink(p)]
    if not found:
        pytest.skip(f"no real libcudart under {cuda}/lib64 (set CUDA_HOME to a CUDA toolkit)")
    path = sorted(found)[-1]
    loaded = load_versions([path])[0]
    if loaded.version is None:
        pytest.skip(f"the toolkit's libcudart cannot be loaded here: {loaded.error}")
    return path, loaded.version
