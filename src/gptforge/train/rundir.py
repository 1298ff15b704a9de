"""The run directory: where it is by default, that it can be made, its one writer, and the config a resume is
compared with.

One writer: an flock on ``RUN/.lock``, held for the whole run, naming its holder. The kernel drops the
lock when the holder dies (even by SIGKILL), so a stale lock never blocks a resume; the file's text
(pid and host) only serves the message of a refused second run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

from gptforge.core.findings import Finding, Severity
from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.reading import read_json
from gptforge.storage import writing

LOCK_NAME = ".lock"
CONFIG_NAME = "config.json"  # the run's resolved config, rewritten at every start


class RunLock:
    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def lock(run_dir: str | os.PathLike) -> RunLock:
    """Take the run directory's lock, or fail in one line naming who holds it."""
    path = Path(run_dir) / LOCK_NAME
    with writing(path):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        check_layout(run_dir)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            raise _misplaced(run_dir, path, "a symbolic link") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _misplaced(run_dir, path, "not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise GptforgeError(f"{run_dir} is in use by {holder}",
                                "wait for that run to finish (or stop it), or give another --run-dir") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
    return RunLock(path, fd)


# What the trainer writes in a run directory, and what each must be: a link or another kind of file there
# would send a write (or a delete) somewhere the user never named.
LAYOUT = {LOCK_NAME: stat.S_ISREG, CONFIG_NAME: stat.S_ISREG, "metrics.jsonl": stat.S_ISREG, "loss.png": stat.S_ISREG,
          "checkpoints": stat.S_ISDIR, "tensorboard": stat.S_ISDIR, "tokenizer": stat.S_ISDIR}


def check_layout(run_dir: str | os.PathLike) -> None:
    """Every name the trainer writes in ``run_dir`` is absent or of its kind, and not a symbolic link."""
    for name, is_kind in LAYOUT.items():
        path = Path(run_dir) / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise _misplaced(run_dir, path, "a symbolic link")
        if not is_kind(mode):
            raise _misplaced(run_dir, path, "a directory" if stat.S_ISDIR(mode) else
                             "not a directory" if is_kind is stat.S_ISDIR else "not a regular file")


def _misplaced(run_dir, path: Path, what: str) -> GptforgeError:
    return GptforgeError(f"{path} is {what}, where the run keeps its own {path.name}",
                         f"move it out of {run_dir}, or give another --run-dir")


def default_run_dir(config_name: str, resume: bool) -> Path:
    """The run directory when none is given: the newest runs/CONFIG* holding a checkpoint to resume, runs/CONFIG
    under a distributed launcher, else a new runs/CONFIG-TIMESTAMP."""
    from gptforge.train.checkpoint import latest
    from gptforge.train.distributed import launched_by_launcher

    stem = Path(config_name).stem
    if resume:
        candidates = [d for d in Path("runs").glob(f"{stem}*") if latest(d / "checkpoints") is not None]
        if candidates:
            return max(candidates, key=lambda d: latest(d / "checkpoints").stat().st_mtime)
    if launched_by_launcher():
        return Path("runs") / stem  # every rank must agree on it without talking
    if resume:
        raise UsageError("--resume", f"no run under runs/{stem}* holds a checkpoint to continue",
                         "pass --run-dir of the run to resume (a --run-dir without a checkpoint yet starts at step 0)")
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def value_changes(before: dict, after: dict) -> list[str]:
    """'KEY OLD -> NEW' (values as JSON) for each key that both config dicts hold with different values."""
    return [f"{key} {json.dumps(before[key])} -> {json.dumps(value)}"
            for key, value in after.items() if key in before and before[key] != value]


def config_changes(run_dir: str | os.PathLike, current: dict) -> Finding | None:
    """On resume: a note naming each key whose value differs from the run's saved config, None when none does
    (or nothing readable was saved), so that a changed default or a forgotten key never changes a run silently."""
    try:
        saved = read_json(Path(run_dir) / CONFIG_NAME, expect=dict)
    except FileReadError:
        return None
    changed = value_changes(saved, current)
    if not changed:
        return None
    return Finding("resume-config-changed", Severity.WARNING,
                   f"resume: {'these keys differ' if len(changed) > 1 else 'this key differs'} from the run's "
                   f"{CONFIG_NAME}: {', '.join(changed)}; the run goes on with the new values (give KEY=VALUE to keep "
                   "a saved one)")


def check_writable(run_dir: Path) -> None:
    """The run directory can be made: a directory can be created (and is removed again) in its nearest
    existing ancestor. Permission bits are not enough: root passes them on /proc and read-only mounts."""
    existing = run_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        os.rmdir(tempfile.mkdtemp(prefix=".gptforge-write-test-", dir=existing))
    except OSError as err:
        raise UsageError("--run-dir", f"{run_dir} cannot be created in {existing}: {err.strerror or err}",
                         "give a --run-dir on a writable file system") from None
