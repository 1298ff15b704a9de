"""The pinned native-build sources (pins.toml): data, updated deliberately."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources


@cache
def pins() -> dict:
    return tomllib.loads(resources.files("gptforge.build").joinpath("pins.toml").read_text())


def apex_pin() -> dict:
    return pins()["apex"]


def deepspeed_pin() -> dict:
    return pins()["deepspeed"]
