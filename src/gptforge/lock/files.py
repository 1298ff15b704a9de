"""The lock's reads, through the package's bounded reader (regular files only, size and depth caps, no YAML
aliases or tags); `what` names the file in the fix."""

from __future__ import annotations

from pathlib import Path


def read_toml(path: Path, what: str = "pixi.toml") -> dict:
    from gptforge.reading import read_toml as bounded

    return bounded(path, fix=f"fix or restore the {what}")


def read_yaml(path: Path, what: str = "pixi.lock"):
    from gptforge.reading import read_yaml as bounded

    return bounded(path, fix=f"regenerate the {what} (pixi run lock), or restore it from git")


def read_json(path: Path, what: str):
    from gptforge.reading import read_json as bounded

    return bounded(path, fix=f"restore the {what}")
