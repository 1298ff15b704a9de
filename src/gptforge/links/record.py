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
import stat

from gptforge.errors import FileReadError, GptforgeError
from gptforge.links.layout import TMP_MARK, Layout
from gptforge.reading import read_json
from gptforge.storage import write_atomic, writing

KINDS = ("absent", "link", "file", "dir", "other")
MAX_RECORD_BYTES = 16 << 20  # a record lists the links of one prefix: far below this


class BadRecord(GptforgeError):
    """The undo record is not one fix-links wrote for this prefix."""


class UndoRecord:
    def __init__(self, layout: Layout, data: dict):
        self.layout = layout
        self.data = data

    @classmethod
    def load(cls, layout: Layout) -> "UndoRecord | None":
        check_own_places(layout)
        try:
            data = read_json(layout.undo_path, max_bytes=MAX_RECORD_BYTES,
                             fix="inspect it; delete it only if you do not need --undo")
        except FileReadError as err:
            if err.code == "missing":
                return None
            raise BadRecord(err.message.replace("cannot read ", "cannot read the undo record ", 1) + "; nothing was changed",
                            err.fix) from None
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


def check_own_places(layout: Layout) -> None:
    """PREFIX/.gptforge and the record in it are fix-links' own: a symbolic link (or another kind of file) there
    would send the record's writes and --undo's deletes wherever it points, so it is refused before any change."""
    directory = os.path.dirname(layout.undo_path)
    for path, is_kind, kind in ((directory, stat.S_ISDIR, "directory"), (layout.undo_path, stat.S_ISREG, "file")):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        except NotADirectoryError:
            return  # the directory above was refused already
        if stat.S_ISLNK(mode) or not is_kind(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else f"not a {kind}"
            raise BadRecord(f"{path} is {what}, where fix-links keeps its own {kind}; nothing was changed",
                            f"move {path} out of the prefix (fix-links did not make it), then rerun")


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
