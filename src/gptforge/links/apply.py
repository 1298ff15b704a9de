"""Carry out a plan: only symlinks are created or replaced, each one atomically.

Order: check that every directory to be changed is writable (a probe link created and removed),
refuse any link that would lead outside the prefix, then for each step: record the path's current
state in the undo record, create the new link under a temporary name in the same directory, and
rename it over the old name. A reader sees the old link or the new one, never a missing name.
"""

from __future__ import annotations

import os

from gptforge.compat.findings import Finding, Severity
from gptforge.errors import GptforgeError
from gptforge.links.layout import TMP_MARK, Layout
from gptforge.links.plan import Step
from gptforge.links.record import UndoRecord
from gptforge.storage import kill_point, writing

_changes = 0


def checkpoint() -> None:
    """Count one file-system change; die here if the crash test asked for it."""
    global _changes
    _changes += 1
    kill_point("change", _changes)


def problems_before_change(layout: Layout, steps: list[Step], record_dir: str) -> list[Finding]:
    """Everything that must hold before the first change; empty when it is safe to start."""
    found = []
    for step in steps:
        where = os.path.dirname(step.path)
        if not layout.inside(where) or (step.target and not layout.inside(os.path.join(where, step.target))):
            found.append(Finding("links-outside-prefix", Severity.ERROR,
                                 f"refused: {step.path} -> {step.target} would lead outside {layout.prefix}; nothing was changed",
                                 "make that link by hand if you trust where it leads, or fix the prefix's links "
                                 "it was planned from, then rerun"))
    dirs = sorted({os.path.dirname(s.path) for s in steps})
    dirs.append(record_dir if os.path.isdir(record_dir) else os.path.dirname(record_dir))
    read_only = [d for d in dict.fromkeys(dirs) if not writable(d)]
    if read_only:
        found.append(Finding("links-read-only", Severity.ERROR,
                             f"cannot create links in {', '.join(read_only)}; nothing was changed",
                             "run as the prefix's owner, or fix the permissions, then rerun"))
    return found


def writable(directory: str) -> bool:
    """Try what a step does (create a link in ``directory``) and undo it; honest even for root."""
    probe = os.path.join(directory, f"{TMP_MARK}{os.getpid()}.probe")
    try:
        os.symlink(".", probe)
    except OSError:
        return False
    os.unlink(probe)
    return True


def apply_steps(layout: Layout, steps: list[Step]) -> int:
    """Apply ``steps`` (already checked); returns how many were applied."""
    record = UndoRecord.for_run(layout)
    for step in steps:
        if step.action == "remove-tmp":
            remove_link(step.path)
            continue
        if record.remember(step.path, step.before.to_json(), {"kind": "link", "target": step.target}):
            record.save("applying")
            checkpoint()
        replace_link(step.path, step.target)
    if record.entries:
        record.save("complete")
        checkpoint()
    return len(steps)


def replace_link(path: str, target: str) -> None:
    """Make ``path`` a symlink to ``target`` atomically: new link under a temp name, then rename."""
    if os.path.lexists(path) and not os.path.islink(path):
        raise GptforgeError(f"{path} became a file or directory while fix-links ran; stopped before replacing it",
                            "rerun the same gptforge fix-links command (with --undo if it was one)")
    tmp = os.path.join(os.path.dirname(path), f"{TMP_MARK}{os.getpid()}.{os.path.basename(path)}")
    if os.path.islink(tmp):
        os.unlink(tmp)
    with writing(path):
        os.symlink(target, tmp)
    checkpoint()
    os.replace(tmp, path)
    checkpoint()


def remove_link(path: str) -> None:
    if os.path.islink(path):  # never a file or a directory
        os.unlink(path)
        checkpoint()
