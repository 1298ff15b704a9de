"""Compile the dataset helpers (``gptforge/data/helpers.cpp``) for the interpreter running this code.

Include directories and the extension suffix come from this interpreter's ``sysconfig`` and the
installed ``pybind11`` — never from a ``python3-config`` on PATH, which may belong to another
Python. The module lands in ``<cache>/helpers/<key>/`` where the key hashes the source and the ABI
(cache tag, extension suffix, machine); a second build with the same key does nothing, and a file
lock makes concurrent builders (several ranks, several nodes on a shared disk) compile once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import FileReadError, GptforgeError
from gptforge.process import split_command
from gptforge.reading import read_bytes, read_json
from gptforge.storage import atomic_path, build_once, cache_dir, write_atomic

MODULE_NAME = "gptforge_helpers"
SOURCE = Path(__file__).resolve().parent.parent / "data" / "helpers.cpp"
# -ffp-contract=off: no fused multiply-add, so blending weights round exactly as in the NumPy reference
CXXFLAGS = ("-O3", "-Wall", "-shared", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden")

_loaded = None


class HelpersBuildError(GptforgeError):
    """The C++ helpers could not be compiled."""


@dataclass(frozen=True)
class HelpersBuild:
    path: Path  # the compiled extension module
    key: str
    built: bool  # False: it was already in the cache
    seconds: float
    command: list[str]


def cache_root() -> Path:
    return cache_dir("helpers")


def abi() -> dict:
    return {
        "cache_tag": sys.implementation.cache_tag,
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "machine": platform.machine(),
    }


def cache_key(source: Path = SOURCE) -> str:
    inputs = {"source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(), **abi()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def module_path(source: Path = SOURCE) -> Path:
    return cache_root() / cache_key(source) / f"{MODULE_NAME}{abi()['ext_suffix']}"


def compile_command(source: Path, output: Path, cxx: str) -> list[str]:
    import pybind11

    includes = dict.fromkeys([sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"], pybind11.get_include()])
    return [*split_command(cxx, "CXX"), *CXXFLAGS, *(f"-I{d}" for d in includes), str(source), "-o", str(output)]


def find_compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(split_command(cxx, "CXX")[0]) is None:
        raise HelpersBuildError(f"C++ compiler {cxx!r} not found", "install g++ (apt-get install g++) or set CXX")
    return cxx


def build_helpers(*, force: bool = False, source: Path = SOURCE) -> HelpersBuild:
    """Compile the helpers into the cache unless an identical build is already there."""
    target = module_path(source)
    start = time.perf_counter()

    def cached() -> HelpersBuild | None:
        entry = intact_entry(target)
        return None if entry is None else HelpersBuild(target, target.parent.name, False, time.perf_counter() - start,
                                                       entry.get("command", []))

    try:
        return build_once(target.parent.with_suffix(".lock"), cached, lambda: _compile(source, target, start), force=force)
    except OSError as err:
        raise HelpersBuildError(f"cannot use the helpers cache {cache_root()}: {err.strerror or err}",
                                "set GPTFORGE_CACHE to a writable directory") from None


def _compile(source: Path, target: Path, start: float) -> HelpersBuild:
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:  # a failed or interrupted compile leaves no partial module
        command = compile_command(source, tmp, find_compiler())
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            log = target.parent / "build.log"
            log.write_text(f"$ {shlex.join(command)}\n{proc.stdout}{proc.stderr}")
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise HelpersBuildError(f"compiling {source.name} failed: {first or f'exit status {proc.returncode}'}", f"full log: {log}")
    entry = {"command": command, **abi(), "python": sys.version.split()[0], "built_at": time.time(),
             "sha256": _sha256(target)}
    write_atomic(target.parent / "entry.json", (json.dumps(entry, indent=2) + "\n").encode())
    return HelpersBuild(target, target.parent.name, True, time.perf_counter() - start, command)


def _sha256(path: Path) -> str:
    return hashlib.sha256(read_bytes(path)).hexdigest()  # a FIFO planted as the module is refused, not waited on


def intact_entry(target: Path) -> dict | None:
    """The cache entry of ``target`` when the module is the very file that was built, else None.

    Importing a truncated or overwritten shared object crashes the process (SIGBUS) or raises an
    ImportError from deep inside the loader; its sha256, recorded at build time, is checked first.
    """
    try:
        entry = read_json(target.parent / "entry.json", expect=dict)
        return entry if entry.get("sha256") == _sha256(target) else None
    except FileReadError:  # entry.json or the module absent, damaged, deep, or not a regular file
        return None


def load_helpers():
    """The compiled module for this interpreter and this source, or None when not built."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = module_path()
    if not path.is_file():
        return None
    if intact_entry(path) is None:  # damaged since it was built: compile it again, else use the NumPy code
        print(f"gptforge: the cached dataset helpers {path} are damaged; compiling them again", file=sys.stderr)
        try:
            build_helpers(force=True)
        except HelpersBuildError as err:
            print(f"gptforge: {err.one_line()}; using the NumPy implementation", file=sys.stderr)
            return None
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded = module
    return module
