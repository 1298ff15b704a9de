"""The undo record: for every path a run changes, what was there before the first change.

It is written atomically (``storage.write_atomic``: temp file, fsync, rename) before each change, so a run killed at any
point leaves a record that covers every change made. A run that finds an unfinished record (status
other than "complete") adds to it, keeping the earliest state of each path; ``--undo`` restores
those states and then deletes the record.

Anyone who can write to a shared prefix can write this file, so ``load`` validates it before use:
entry paths relative, normalised, without ``..``, inside the prefix once resolved; states of a known
shape. A record that fails is refused whole, in one line.
"""

from __future__ import annotations

import json
import os

from gptforge.errors import GptforgeError
from gptforge.links.layout import TMP_MARK, Layout
from gptforge.storage import write_atomic, writing

KINDS = ("absent", "link", "file", "dir", "other")


class BadRecord(GptforgeError):
    """The undo record is not one fix-links wrote for this prefix."""


class UndoRecord:
    def __init__(self, layout: Layout, data: dict):
        self.layout = layout
        self.data = data

    @classmethod
    def load(cls, layout: Layout) -> "UndoRecord | None":
        try:
            with open(layout.undo_path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise BadRecord(f"cannot read the undo record {layout.undo_path}: {err}",
                            "inspect it; delete it only if you do not need --undo") from None
        problem = validate(layout, data)
        if problem:
            raise BadRecord(f"refused the undo record {layout.undo_path}: {problem}; nothing was changed",
                            "it was not written by fix-links for this prefix; inspect it, restore links by hand")
        return cls(layout, data)

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

    def remember(self, path: str, before: dict, after: dict) -> bool:
        """Record ``path``'s state before its first change and the state this change leaves (undo
        acts only where the path is still in that state); False if the record already says so."""
        rel = self.layout.rel(path)
        for e in self.entries:
            if e["path"] == rel:
                changed, e["after"] = e.get("after") != after, after
                return changed
        self.entries.append({"path": rel, "before": before, "after": after})
        return True

    def save(self, status: str) -> None:
        self.data["status"] = status
        directory = os.path.dirname(self.layout.undo_path)
        created = not os.path.isdir(directory)
        tmp = os.path.join(directory, f"{TMP_MARK}{os.getpid()}.json")  # delete() sweeps what a killed save left
        try:
            with writing(self.layout.undo_path):
                os.makedirs(directory, exist_ok=True)
            write_atomic(self.layout.undo_path, json.dumps(self.data, indent=1).encode(), tmp)
        finally:
            if created and os.path.isdir(directory) and not os.listdir(directory):
                os.rmdir(directory)  # a first save that failed leaves the prefix as it was

    def delete(self) -> None:
        """Remove the record, stale temp files next to it, and its directory when empty."""
        directory = os.path.dirname(self.layout.undo_path)
        os.unlink(self.layout.undo_path)
        for name in os.listdir(directory):
            if name.startswith(TMP_MARK):
                os.unlink(os.path.join(directory, name))
        if not os.listdir(directory):
            os.rmdir(directory)


def validate(layout: Layout, data) -> str | None:
    """What is wrong with a loaded record, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return "not an object with a list of entries"
    for number, item in enumerate(data["entries"], 1):
        problem = _entry_problem(layout, item)
        if problem:
            return f"entry {number}: {problem}"
    return None


def _entry_problem(layout: Layout, item) -> str | None:
    if not isinstance(item, dict) or not isinstance(item.get("path"), str):
        return "not an object with a path"
    rel = item["path"]
    if not rel or "\0" in rel or os.path.isabs(rel) or rel != os.path.normpath(rel) or rel == "." \
            or ".." in rel.split(os.sep):
        return f"path {rel!r} is not a plain relative path"
    if not layout.inside(os.path.dirname(os.path.join(layout.prefix, rel))):
        return f"path {rel!r} leads outside {layout.prefix}"
    for key in ("before", "after"):
        if key == "after" and key not in item:
            continue  # records of earlier versions hold no "after"
        problem = _state_problem(item.get(key))
        if problem:
            return f"{key} of {rel!r}: {problem}"
    return None


def _state_problem(state) -> str | None:
    if not isinstance(state, dict) or state.get("kind") not in KINDS:
        return f"not a state (kind one of {', '.join(KINDS)})"
    if state["kind"] == "link" and (not isinstance(state.get("target"), str) or not state["target"] or "\0" in state["target"]):
        return "a link without a target"
    return None
