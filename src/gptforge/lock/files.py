"""Writing the lock's files: whole or not at all (a temp name in the same directory, then a rename)."""

from __future__ import annotations

from pathlib import Path

from gptforge.storage import write_atomic


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())



# The lock's reads go through the package's bounded reader (regular files only, size and depth caps,
# no YAML aliases or tags); `what` names the file in the fix.
def read_toml(path: Path, what: str = "pixi.toml") -> dict:
    from gptforge.reading import read_toml as bounded

    return bounded(path, fix=f"fix or restore the {what}")


def read_yaml(path: Path, what: str = "pixi.lock"):
    from gptforge.reading import read_yaml as bounded

    return bounded(path, fix=f"regenerate the {what} (pixi run lock), or restore it from git")


def read_json(path: Path, what: str):
    from gptforge.reading import read_json as bounded

    return bounded(path, fix=f"restore the {what}")
