"""The undo record: for every path a run changes, what was there before the first change.

It is written atomically (temp file, fsync, rename) before each change, so a run killed at any
point leaves a record that covers every change made. A run that finds an unfinished record (status
other than "complete") adds to it, keeping the earliest state of each path; ``--undo`` restores
those states and then deletes the record.
"""

from __future__ import annotations

import json
import os

from gptforge.links.layout import TMP_MARK, Layout


class UndoRecord:
    def __init__(self, layout: Layout, data: dict):
        self.layout = layout
        self.data = data

    @classmethod
    def load(cls, layout: Layout) -> "UndoRecord | None":
        try:
            with open(layout.undo_path, encoding="utf-8") as f:
                return cls(layout, json.load(f))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            from gptforge.errors import GptforgeError

            raise GptforgeError(f"cannot read the undo record {layout.undo_path}: {err}",
                                "inspect it; delete it only if you do not need --undo") from err

    @classmethod
    def for_run(cls, layout: Layout) -> "UndoRecord":
        """The record this run adds to: the unfinished one, or a fresh one."""
        old = cls.load(layout)
        if old is not None and old.data.get("status") != "complete":
            return old
        return cls(layout, {"format": 1, "prefix": layout.prefix, "status": "applying", "entries": []})

    @property
    def entries(self) -> list[dict]:
        return self.data["entries"]

    def remember(self, path: str, before: dict) -> bool:
        """Record ``path``'s state before its first change; False if it is already recorded."""
        rel = self.layout.rel(path)
        if any(e["path"] == rel for e in self.entries):
            return False
        self.entries.append({"path": rel, "before": before})
        return True

    def save(self, status: str) -> None:
        self.data["status"] = status
        directory = os.path.dirname(self.layout.undo_path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f"{TMP_MARK}{os.getpid()}.json")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.layout.undo_path)

    def delete(self) -> None:
        """Remove the record, stale temp files next to it, and its directory when empty."""
        directory = os.path.dirname(self.layout.undo_path)
        os.unlink(self.layout.undo_path)
        for name in os.listdir(directory):
            if name.startswith(TMP_MARK):
                os.unlink(os.path.join(directory, name))
        if not os.listdir(directory):
            os.rmdir(directory)
