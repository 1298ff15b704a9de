"""Ask a CUDA library its own version: load it in a fresh process and call its version function.

Used where a file's name does not carry the version (NVIDIA's wheels name ``libcudart.so.13`` by its
SONAME only; the ELF data holds no minor either) and to prove a repair. Every function called needs
no GPU and no driver. A separate interpreter (``python -I -S``) gives a fresh loader state: a library
already loaded in this process (by torch, say) cannot answer in its place, and a library that
crashes on load takes only the probe down.

ABIs (the signatures NVIDIA documents; which library uses which is data, in families.json):
  runtime      ``int f(int *v)``, v = major*1000 + minor*10 (cudaRuntimeGetVersion)
  major-minor  ``int f(int *major, int *minor)`` (nvrtcVersion, nvJitLinkVersion)
  property     ``int f(libraryPropertyType t, int *v)`` for MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
Each returns 0 on success.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from gptforge.core.versions import CudaVersion

# One JSON line per request ([index, status, values]): paths may hold spaces or any other character.
_PROBE = """
import ctypes, json, sys
def call(f, abi):
    if abi == "runtime":
        v = ctypes.c_int(-1); rc = f(ctypes.byref(v)); return rc, [v.value]
    if abi == "major-minor":
        a, b = ctypes.c_int(-1), ctypes.c_int(-1); rc = f(ctypes.byref(a), ctypes.byref(b)); return rc, [a.value, b.value]
    out = []
    for kind in (0, 1, 2):
        v = ctypes.c_int(-1); rc = f(kind, ctypes.byref(v))
        if rc: return rc, out
        out.append(v.value)
    return 0, out
for i, (path, symbol, abi) in enumerate(json.loads(sys.stdin.read())):
    try:
        f = getattr(ctypes.CDLL(path), symbol)
        f.restype = ctypes.c_int
        rc, values = call(f, abi)
    except (OSError, AttributeError) as err:
        print(json.dumps([i, "error", str(err)]), flush=True)
        continue
    print(json.dumps([i, rc, values]), flush=True)
"""
TIMEOUT_S = 60


@dataclass(frozen=True)
class Reading:
    path: str
    raw: tuple[int, ...] | None  # what the function wrote; None when loading or the call failed
    error: str = ""

    @property
    def version(self) -> tuple[int, ...] | None:
        """(major, minor[, patch]); a runtime number 13000 reads as (13, 0)."""
        if self.raw is None:
            return None
        if len(self.raw) == 1:
            cuda = CudaVersion.from_encoded(self.raw[0])
            return (cuda.major, cuda.minor)
        return self.raw


def read_versions(requests: list[tuple[str, str, str]]) -> list[Reading]:
    """One reading per (path, symbol, abi), all in one fresh process."""
    if not requests:
        return []
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE], input=json.dumps(requests),
                             capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        stdout, stderr = out.stdout, out.stderr
    except subprocess.TimeoutExpired as err:
        stdout, stderr = _text(err.stdout), f"loading took more than {TIMEOUT_S} s"
    by_index = {}
    for line in stdout.splitlines():
        i, status, value = json.loads(line)
        path = requests[i][0]
        if status == "error":
            by_index[i] = Reading(path, None, value.replace("\n", " "))
        elif status == 0 and value and min(value) >= 0:
            by_index[i] = Reading(path, tuple(value))
        else:
            by_index[i] = Reading(path, None, f"{requests[i][1]} returned error {status}")
    died = stderr.strip().splitlines()[-1:] or ["the probe process printed nothing"]
    return [by_index.get(i, Reading(r[0], None, died[0])) for i, r in enumerate(requests)]


@dataclass(frozen=True)
class Loaded:
    path: str
    version: int | None  # e.g. 13000 for 13.0; None when loading or the call failed
    error: str = ""


def load_versions(paths: list[str]) -> list[Loaded]:
    """cudaRuntimeGetVersion of each libcudart in PATHS: the proof of a repair."""
    readings = read_versions([(p, "cudaRuntimeGetVersion", "runtime") for p in paths])
    return [Loaded(r.path, r.raw[0] if r.raw else None, r.error) for r in readings]


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
