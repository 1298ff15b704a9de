"""GPU name -> compute capability, by the matching rule documented in data/gpus.toml.

The name is lower-cased; '-', '_' and '/' become spaces; the brand words "nvidia", "geforce",
"tesla" and "quadro" are dropped. A table name matches when its words occur as a contiguous run
of the name's words; the longest matching table name wins. So "NVIDIA H100 80GB HBM3",
"A100-SXM4-40GB", "rtx 4090" and "NVIDIA RTX 6000 Ada Generation" all resolve.
"""

from __future__ import annotations

import re
from functools import cache

from gptforge.compat.arches import CC, parse_arch
from gptforge.compat.facts import facts, load_table
from gptforge.core.versions import VersionError, format_cc, parse_cc

_BRAND_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


class UnknownGpu(VersionError):
    """A GPU name no table entry matches (or that matches two different CCs)."""


def words(name: str) -> tuple[str, ...]:
    cleaned = re.sub(r"[-_/(),]+", " ", name.lower())
    return tuple(w for w in cleaned.split() if w not in _BRAND_WORDS)


@cache
def _table() -> tuple[tuple[tuple[str, ...], CC, str], ...]:
    rows = []
    for row in load_table("gpus.toml")["gpu"]:
        cc = parse_arch(row["cc"]).cc
        rows.extend((words(name), cc, name) for name in row["names"])
    return tuple(rows)


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def gpu_cc(name: str) -> CC:
    """The compute capability of a GPU named as nvidia-smi, NVML or a user writes it."""
    target = words(name)
    matches = [(len(key), cc, label) for key, cc, label in _table() if key and _contains(target, key)]
    if not matches:
        raise UnknownGpu(f"unknown GPU {name!r} (give its compute capability with --cc X.Y instead)")
    longest = max(m[0] for m in matches)
    best = {(cc, label) for length, cc, label in matches if length == longest}
    ccs = {cc for cc, _ in best}
    if len(ccs) > 1:
        names = ", ".join(sorted(label for _, label in best))
        raise UnknownGpu(f"ambiguous GPU name {name!r} (matches {names}; use --cc X.Y)")
    return ccs.pop()


def validate_cc(text: str) -> CC:
    """Parse a compute capability and require that it belongs to a real GPU architecture."""
    cc = parse_cc(text)
    if not facts().known_cc(cc):
        known = " ".join(sorted({format_cc(a.cc) for a in facts().known_arches}, key=lambda s: parse_cc(s)))
        raise VersionError(f"unknown compute capability {format_cc(cc)} (known: {known})")
    return cc
