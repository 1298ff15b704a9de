"""Library families (facts in families.json) and the rule that says which real file a family's
links must resolve to for a given CUDA release."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache

Version = tuple[int, ...]


@dataclass(frozen=True)
class Family:
    stem: str  # "libcudart"
    rule: str  # "cuda" | "cuda-or-newer-minor" | "table" | "newest-per-major"
    cuda_from: Version = (0,)
    table: tuple[Version, ...] | None = None  # for rule "table": versions shipped with the CUDA asked for
    why: str = ""
    probe: tuple[str, str] | None = None  # (symbol, abi): the library's own version function, see libversion

    @property
    def detail(self) -> int:
        """How many parts of a version the rule needs: a name with fewer (``libcudart.so.13``) is
        read from the file itself."""
        return {"cuda": 2, "cuda-or-newer-minor": 2, "table": 3}.get(self.rule, 1)

    @property
    def pattern(self) -> re.Pattern:
        return _name_pattern(self.stem)

    def version_of(self, name: str) -> Version | None:
        """The version in a file name ``libX.so.1.2.3``; None for other names (and for ``libX.so``)."""
        m = self.pattern.match(name)
        return tuple(int(p) for p in m.group(1).split(".")) if m else None

    def matches(self, version: Version, cuda: Version) -> bool | None:
        """Whether a real file of ``version`` belongs with ``cuda``; None when the facts cannot tell."""
        if self.rule == "cuda":
            return None if cuda < self.cuda_from else version[:2] == cuda[:2]
        if self.rule == "cuda-or-newer-minor":
            return None if cuda < self.cuda_from else version[0] == cuda[0] and version[:2] >= cuda[:2]
        if self.rule == "table":
            # a version read from the file has three parts (12.6.3), a file name four (12.6.3.3)
            return None if self.table is None else any(version[: len(t)] == t[: len(version)] for t in self.table)
        return True  # newest-per-major: any version is a candidate; choice picks the newest

    def unversioned(self) -> str:
        return f"{self.stem}.so"


@lru_cache(maxsize=1)
def _data() -> dict:
    with open(os.path.join(os.path.dirname(__file__), "families.json"), encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def _name_pattern(stem: str) -> re.Pattern:
    return re.compile(re.escape(stem) + r"\.so\.(\d+(?:\.\d+)*)$")


def parse_version(text: str) -> Version:
    return tuple(int(p) for p in text.split("."))


def families_for(cuda: Version) -> list[Family]:
    """All families, with table rules resolved for the CUDA release ``cuda`` (major, minor)."""
    data = _data()
    key = f"{cuda[0]}.{cuda[1]}"
    out = []
    for row in data["families"]:
        table = None
        if row["rule"] == "table":
            listed = data["tables"][row["table"]]["versions"].get(key)
            table = tuple(parse_version(v) for v in listed) if listed else None
        out.append(
            Family(
                stem=row["stem"],
                rule=row["rule"],
                cuda_from=parse_version(row.get("cuda_from", "0")),
                table=table,
                why=row.get("why", ""),
                probe=(row["probe"]["symbol"], row["probe"]["abi"]) if "probe" in row else None,
            )
        )
    return out

