"""Facts the lock builder needs, as data (lock/data/*.toml), each row with its source."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.resources import files


@cache
def table(name: str) -> dict:
    return tomllib.loads(files("gptforge.lock").joinpath("data", name).read_text())


def platform_defaults(subdir: str) -> list[str]:
    for row in table("platforms.toml")["platform"]:
        if row["subdir"] == subdir:
            return list(row["virtual_packages"])
    raise KeyError(subdir)
