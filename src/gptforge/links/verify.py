"""Prove the repair: load the libcudart the links lead to, in a fresh process, and ask its version.

``cudaRuntimeGetVersion`` needs no GPU and no driver. A separate interpreter gives a fresh loader
state: a library already loaded in this process (by torch, say) cannot answer in its place.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptforge.links.libversion import read_versions


@dataclass(frozen=True)
class Loaded:
    path: str
    version: int | None  # e.g. 13000 for 13.0; None when loading or the call failed
    error: str = ""


def load_versions(paths: list[str]) -> list[Loaded]:
    readings = read_versions([(p, "cudaRuntimeGetVersion", "runtime") for p in paths])
    return [Loaded(r.path, r.raw[0] if r.raw else None, r.error) for r in readings]
