"""What a path that should name a regular file is instead, in words an error message can use."""

from __future__ import annotations

import os
import stat

_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
)


def not_a_file(path: str | os.PathLike) -> str | None:
    """None for a regular file (or a link to one), else why not: "not found", "is a FIFO ...", ...

    "not found" only when nothing is there: /dev/zero or a pipe reported as missing sends users looking
    for a typo that is not there.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if os.path.islink(path) else "not found"
    except OSError as err:
        return f"cannot be examined ({err.strerror})"
    return None if stat.S_ISREG(mode) else mode_words(mode)


def mode_words(mode: int) -> str:
    """What a file of ``mode`` (not a regular one) is: "is a directory", "is a FIFO ...", ..."""
    return next((words for test, words in _KINDS if test(mode)), "is not a regular file")
