"""Writing files: one atomic writer, and one way to report a write that failed (a full disk above all)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from gptforge.errors import GptforgeError

FULL = (errno.ENOSPC, errno.EDQUOT)
ALMOST_FULL = 1 << 20


def _free_bytes(path: str | os.PathLike) -> int:
    """Free bytes of the file system holding ``path`` (or its nearest existing ancestor); -1 if unknown."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return -1


def free_space(path: str | os.PathLike) -> str:
    free = _free_bytes(path)
    if free < 0:
        return "unknown free space"
    if free < 1024:
        return f"{free} bytes free"
    exponent = min(3, (free.bit_length() - 1) // 10)
    return f"{free / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]} free"


def write_failed(path: str | os.PathLike, err: BaseException) -> GptforgeError:
    """The one-line error for a write to ``path`` that failed with ``err``."""
    code = getattr(err, "errno", None)
    if code is None and _free_bytes(path) < ALMOST_FULL:  # torch reports a short write without an errno
        code = errno.ENOSPC
    reason = os.strerror(code) if code else (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
    fix = "free space there or write elsewhere" if code in FULL else "check the path, its permissions and the free space"
    return GptforgeError(f"cannot write {path}: {reason} ({free_space(path)} on its file system)", fix)


@contextlib.contextmanager
def writing(path: str | os.PathLike, *also: type[BaseException]):
    """Turn an OSError (and ``also``: e.g. torch's RuntimeError for a failed write) into one line naming ``path``."""
    try:
        yield
    except (OSError, *also) as err:
        raise write_failed(path, err) from None


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` under a temporary name, fsync, rename over ``path``: readers see old or new, never part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path):
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
