"""GPU names as nvidia-smi, NVML, torch or a user writes them, matched by one rule against any table
of GPU names (compat/data/gpus.toml, configs/gpu_peaks.toml).

The name is lower-cased; '-', '_', '/', '(', ')' and ',' become spaces, and so does the boundary of a series and its
number and of a number and a word after it ("RTX3090" is "rtx 3090", "3090Ti" "3090 ti"; "960M" stays one word); the
brand words "nvidia", "geforce", "tesla" and "quadro" are dropped. A table name matches when its words occur as a
contiguous run of the name's words; the longest matching table names win. So "NVIDIA H100 80GB HBM3",
"A100-SXM4-40GB", "rtx 4090", "RTX4090" and "NVIDIA RTX 6000 Ada Generation" all resolve, and "GH200" is not "H200".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeVar

_BRAND_WORDS = {"nvidia", "geforce", "tesla", "quadro"}
# a series glued to its number ("rtx3090", "a100") and a word glued after it ("3090ti", "80gb"); a single letter after
# the number stays, it names another product ("GTX 960M" is a Maxwell GM107, CC 5.0; "GTX 960" a GM206, CC 5.2)
_GLUED = re.compile(r"(?<=[a-z])(?=[0-9])|(?<=[0-9])(?=[a-z]{2})")
V = TypeVar("V")


def words(name: str, *, keep_brands: bool = False) -> tuple[str, ...]:
    """The name's words, brand words dropped; with ``keep_brands`` only the vendor word "nvidia" is dropped
    ("Quadro RTX 6000" names one product, a bare "RTX 6000" two)."""
    cleaned = re.sub(r"[-_/(),]+", " ", name.lower())
    cleaned = _GLUED.sub(" ", cleaned)
    dropped = {"nvidia"} if keep_brands else _BRAND_WORDS
    return tuple(w for w in cleaned.split() if w not in dropped)


def contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    """``needle`` occurs as a contiguous run of ``haystack``'s words."""
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def longest_matches(name: str, table: Iterable[tuple[tuple[str, ...], V]]) -> list[V]:
    """The values of the rows whose key (a table name's ``words``) matches ``name``, the longest keys
    only, in table order; [] when none matches."""
    target = words(name)
    found = [(len(key), value) for key, value in table if key and contains(target, key)]
    longest = max((n for n, _ in found), default=0)
    return [value for n, value in found if n == longest]
