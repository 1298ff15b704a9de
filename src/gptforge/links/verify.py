"""Prove the repair: load the libcudart the links lead to, in a fresh process, and ask its version.

``cudaRuntimeGetVersion`` needs no GPU and no driver. A separate interpreter gives a fresh loader
state: a library already loaded in this process (by torch, say) cannot answer in its place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from gptforge.links.families import Version

# One JSON line per path ([index, status, value]): paths may hold spaces or any other character.
_PROBE = """
import ctypes, json, sys
for i, path in enumerate(sys.argv[1:]):
    v = ctypes.c_int(-1)
    try:
        rc = ctypes.CDLL(path).cudaRuntimeGetVersion(ctypes.byref(v))
    except (OSError, AttributeError) as err:
        print(json.dumps([i, "error", str(err)]))
        continue
    print(json.dumps([i, rc, v.value]))
"""


@dataclass(frozen=True)
class Loaded:
    path: str
    version: int | None  # e.g. 13000 for 13.0; None when loading or the call failed
    error: str = ""


def runtime_number(cuda: Version) -> int:
    """The integer cudaRuntimeGetVersion returns for CUDA major.minor."""
    return cuda[0] * 1000 + cuda[1] * 10


def load_versions(paths: list[str]) -> list[Loaded]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, *paths],
                         capture_output=True, text=True, timeout=60, env=env)
    by_index = {}
    for line in out.stdout.splitlines():
        i, status, value = json.loads(line)
        path = paths[i]
        if status == "error":
            by_index[i] = Loaded(path, None, value.replace("\n", " "))
        elif status == 0:
            by_index[i] = Loaded(path, value)
        else:
            by_index[i] = Loaded(path, None, f"cudaRuntimeGetVersion returned error {status}")
    missing = out.stderr.strip().splitlines()[-1:] or ["the probe process printed nothing"]
    return [by_index.get(i, Loaded(p, None, missing[0])) for i, p in enumerate(paths)]
