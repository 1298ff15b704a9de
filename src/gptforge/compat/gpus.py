"""GPU name -> compute capability, by the GPU-name rule of core.gpus over data/gpus.toml."""

from __future__ import annotations

from functools import cache

from gptforge.compat.arches import CC, parse_arch
from gptforge.compat.facts import facts, load_table
from gptforge.core.gpus import contains, longest_matches, words
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


@cache
def _branded_table() -> tuple[tuple[tuple[str, ...], CC, str], ...]:
    return tuple((words(label, keep_brands=True), cc, label) for _, cc, label in _table())


def gpu_candidates(name: str) -> dict[CC, tuple[str, ...]]:
    """Every compute capability a GPU name may stand for, each with the table names behind it.

    A name is the table name it contains (the longest), and also each longer table name it is part of, brand
    words counted: a bare 'TITAN X' (nvidia-smi prints 'TITAN X (Pascal)' or 'GeForce GTX TITAN X', never that)
    is the Pascal TITAN X (6.1) or the Maxwell GTX TITAN X (5.2); 'Quadro RTX 6000' is one card, 'RTX 6000' also
    the RTX 6000 Ada (8.9)."""
    if all(w.isdigit() for w in words(name, keep_brands=True)) or not (
            best := longest_matches(name, ((key, (cc, label)) for key, cc, label in _table()))):
        return _part_of_names(name)
    given = words(name, keep_brands=True)
    longer = [(cc, label) for key, cc, label in _branded_table() if len(key) > len(given) and contains(key, given)]
    return _by_cc(best + longer)


def _by_cc(matches: list[tuple[CC, str]]) -> dict[CC, tuple[str, ...]]:
    """(CC, table name) pairs as each CC with its names, lowest CC first."""
    found: dict[CC, tuple[str, ...]] = {}
    for cc, label in matches:
        found[cc] = found.get(cc, ()) + (label,)
    return dict(sorted(found.items()))


def _part_of_names(name: str) -> dict[CC, tuple[str, ...]]:
    """A model number a user types without its series ('4090', '3090 Ti'), or a bare number: the table names it is
    part of, when they all have one CC. Several CCs ('6000': Quadro 6000, RTX 6000 Ada, RTX PRO 6000, ...) are refused
    with each named: nvidia-smi never prints such a name, so it is a user's shorthand, not one product to judge."""
    given = words(name)
    found = _by_cc([(cc, label) for key, cc, label in _table() if contains(key, given)]) \
        if any(w.isdigit() for w in given) else {}
    if not found:
        raise UnknownGpu(f"unknown GPU {name!r} (give its compute capability with --cc X.Y instead)")
    if len(found) > 1:
        raise UnknownGpu(f"GPU {name!r} is part of several products' names ({describe_candidates(found)}); "
                         "write the product's name or use --cc X.Y")
    return found


def gpu_cc(name: str) -> CC:
    """The compute capability of a GPU named as nvidia-smi, NVML or a user writes it."""
    found = gpu_candidates(name)
    if len(found) > 1:
        raise UnknownGpu(f"ambiguous GPU name {name!r} ({describe_candidates(found)}; use --cc X.Y)")
    return next(iter(found))


def describe_candidates(found: dict[CC, tuple[str, ...]]) -> str:
    """'GTX TITAN X: CC 5.2, or TITAN X: CC 6.1'."""
    return ", or ".join(f"{' / '.join(labels)}: CC {format_cc(cc)}" for cc, labels in found.items())


def validate_cc(text: str) -> CC:
    """Parse a compute capability and require that it belongs to a real GPU architecture."""
    cc = parse_cc(text)
    if not facts().known_cc(cc):
        known = " ".join(sorted({format_cc(a.cc) for a in facts().known_arches}, key=lambda s: parse_cc(s)))
        raise VersionError(f"unknown compute capability {format_cc(cc)} (known: {known})")
    return cc
