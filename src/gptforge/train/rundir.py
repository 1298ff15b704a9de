"""One writer per run directory: an flock on ``RUN/.lock``, held for the whole run, naming its holder.

The kernel drops the lock when the holder dies (even by SIGKILL), so a stale lock never blocks a
resume; the file's text (pid and host) only serves the message of a refused second run.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.storage import writing

LOCK_NAME = ".lock"


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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
