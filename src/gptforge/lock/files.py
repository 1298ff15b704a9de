"""Writing the lock's files: whole or not at all (a temp name in the same directory, then a rename)."""

from __future__ import annotations

from pathlib import Path

from gptforge.storage import write_atomic


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())
