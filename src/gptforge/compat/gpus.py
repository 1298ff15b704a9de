"""GPU name -> compute capability, by the GPU-name rule of core.gpus over data/gpus.toml."""

from __future__ import annotations

from functools import cache

from gptforge.compat.arches import CC, parse_arch
from gptforge.compat.facts import facts, load_table
from gptforge.core.gpus import longest_matches, words
from gptforge.core.versions import VersionError, format_cc, parse_cc


class UnknownGpu(VersionError):
    """A GPU name no table entry matches (or that matches two different CCs)."""


@cache
def _table() -> tuple[tuple[tuple[str, ...], CC, str], ...]:
    rows = []
    for row in load_table("gpus.toml")["gpu"]:
        cc = parse_arch(row["cc"]).cc
        rows.extend((words(name), cc, name) for name in row["names"])
    return tuple(rows)


def gpu_cc(name: str) -> CC:
    """The compute capability of a GPU named as nvidia-smi, NVML or a user writes it."""
    best = longest_matches(name, ((key, (cc, label)) for key, cc, label in _table()))
    if not best:
        raise UnknownGpu(f"unknown GPU {name!r} (give its compute capability with --cc X.Y instead)")
    ccs = {cc for cc, _ in best}
    if len(ccs) > 1:
        names = ", ".join(sorted({label for _, label in best}))
        raise UnknownGpu(f"ambiguous GPU name {name!r} (matches {names}; use --cc X.Y)")
    return ccs.pop()


def validate_cc(text: str) -> CC:
    """Parse a compute capability and require that it belongs to a real GPU architecture."""
    cc = parse_cc(text)
    if not facts().known_cc(cc):
        known = " ".join(sorted({format_cc(a.cc) for a in facts().known_arches}, key=lambda s: parse_cc(s)))
        raise VersionError(f"unknown compute capability {format_cc(cc)} (known: {known})")
    return cc
