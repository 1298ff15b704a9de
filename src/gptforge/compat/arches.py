"""GPU architectures: parsing "9.0a" / "sm_90a", and the binary-compatibility rule.

A cubin for X.y runs on a GPU of compute capability X.z when z >= y (same major). Suffixed
cubins ("9.0a" arch-specific, "10.0f" family-specific) are only counted for the exact CC.
PTX for compute_X.y is JIT-compiled by the driver for any GPU of CC >= X.y.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gptforge.core.versions import VersionError

CC = tuple[int, int]


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "", "a" (arch-specific) or "f" (family-specific)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def cc(self) -> CC:
        return (self.major, self.minor)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def base(self) -> Arch:
        return Arch(self.major, self.minor)


_ARCH = re.compile(r"^(?:(?:sm|compute)_)?(\d{1,2})\.?(\d)([af]?)$", re.ASCII)


def parse_arch(text: str) -> Arch:
    """'9.0a', 'sm_90a', '90a', 'compute_90', '8.6' -> Arch."""
    raw = str(text).strip().lower()
    match = _ARCH.match(raw)
    if not match:
        raise VersionError(f"{text!r} is not a GPU architecture (expected e.g. 9.0, 9.0a or sm_90a)")
    return Arch(int(match.group(1)), int(match.group(2)), match.group(3))


def arch_list_items(text: str) -> list[str]:
    """The entries of an arch list: ';', ',' and spaces separate them ("8.0;9.0+PTX" -> ["8.0", "9.0+PTX"])."""
    return [item for item in re.split(r"[;\s,]+", str(text).strip()) if item]


def parse_arch_list(text: str) -> tuple[list[Arch], list[Arch]]:
    """A TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", spaces also separate) -> (SASS arches, PTX arches)."""
    sass: list[Arch] = []
    ptx: list[Arch] = []
    for item in arch_list_items(text):
        name, plus, rest = item.partition("+")
        if plus and rest.lower() != "ptx":
            raise VersionError(f"{item!r} in the arch list: only '+PTX' may follow an architecture")
        arch = parse_arch(name)
        sass.append(arch)
        if plus:
            ptx.append(arch)
    return sass, ptx


def runs_on(arch: Arch, cc: CC) -> bool:
    """Does a cubin for ``arch`` run on a GPU of compute capability ``cc``?"""
    if arch.suffix:
        return arch.cc == cc
    return arch.major == cc[0] and arch.minor <= cc[1]


def ptx_runs_on(arch: Arch, cc: CC) -> bool:
    """Can the driver JIT PTX built for ``arch`` on a GPU of compute capability ``cc``?"""
    return not arch.suffix and arch.cc <= cc


def best_cubin(arches: list[Arch], cc: CC, *, allow_suffix: bool) -> Arch | None:
    """The arch to compile for a GPU of ``cc`` out of ``arches`` (what nvcc can target).

    Exact CC first (its 'a' variant when allowed), else the highest lower minor of the same major.
    """
    if allow_suffix and Arch(cc[0], cc[1], "a") in arches:
        return Arch(cc[0], cc[1], "a")
    plain = [a for a in arches if not a.suffix and runs_on(a, cc)]
    return max(plain) if plain else None
