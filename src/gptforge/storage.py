"""Writing files: atomic writes, published directories, a locked build-once cache, the cache root, and one
way to report a write that failed (a full disk above all)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from filelock import FileLock

from gptforge.errors import GptforgeError

FULL = (errno.ENOSPC, errno.EDQUOT)
ALMOST_FULL = 1 << 20
T = TypeVar("T")


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


def cache_dir(name: str) -> Path:
    """``name`` under the gptforge cache: ``$GPTFORGE_CACHE``, else ``$XDG_CACHE_HOME/gptforge``, else
    ``~/.cache/gptforge`` (docs/build.md shows the layout under it)."""
    env = os.environ.get("GPTFORGE_CACHE")
    root = Path(env).expanduser() if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptforge"
    return root / name


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to; renamed over ``path`` when the block ends without
    an error, removed when it raises. ``tmp``: a name of the caller's convention (its own sweeper finds it)."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.tmp-{os.getpid()}{''.join(path.suffixes[-1:])}")
    try:
        tmp.unlink(missing_ok=True)  # a link planted at the predictable name is removed, never written through
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, data: bytes, tmp: str | os.PathLike | None = None) -> None:
    """Write ``data`` under a temporary name, fsync, rename over ``path``: readers see old or new, never part."""
    with writing(path), atomic_path(path, tmp) as staged, open(staged, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def publish_dir(stage: Path, final: Path, *, replace: bool = False) -> None:
    """Rename the finished directory ``stage`` to ``final`` in one step. With ``replace`` an existing
    ``final`` is renamed aside first and removed after: readers see the old tree or the new, never a mix."""
    if replace and os.path.lexists(final):
        old = final.with_name(f".trash-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, final)


def build_once(lock: Path, lookup: Callable[[], T | None], build: Callable[[], T], *, force: bool = False,
               on_wait: Callable[[Path], None] | None = None,
               unwritable: Callable[[OSError], BaseException] | None = None) -> T:
    """``lookup()``'s entry, else ``build()``'s, which runs at most once across the processes (and nodes on a
    shared file system) that use the file lock ``lock``. A process that waited for the lock finds the entry
    its holder just built, even when asked to ``force`` a build. ``unwritable`` turns a lock that cannot be
    created into the caller's error."""
    if not force and (hit := lookup()) is not None:
        return hit
    held = FileLock(str(lock))
    try:
        Path(lock).parent.mkdir(parents=True, exist_ok=True)
        held.acquire(timeout=0)
    except TimeoutError:  # before OSError, its base class
        if on_wait:
            on_wait(Path(lock))
        held.acquire()
        force = False  # the holder just built it; building again would be the duplicate the lock avoids
    except OSError as err:
        if unwritable is None:
            raise
        raise unwritable(err) from None
    try:
        if not force and (hit := lookup()) is not None:
            return hit
        return build()
    finally:
        held.release()


KILL_ENV = "GPTFORGE_TEST_KILL_AT"


def kill_point(point: str, n: int) -> None:
    """Fault injection for the crash-safety tests: with ``GPTFORGE_TEST_KILL_AT=POINT:N`` the process SIGKILLs
    itself where it reaches ``point`` number ``n`` (``step:N`` mid-step N after backward, ``save:N`` mid-save
    of step N after the model file, ``change:N`` at fix-links' N-th file-system change). ``SIGNAL@POINT:N``
    sends that signal instead (``TERM@step:N``: the notice Slurm gives before it stops a job). Unset: nothing."""
    name, _, where = os.environ.get(KILL_ENV, "").rpartition("@")
    if where == f"{point}:{n}":
        os.kill(os.getpid(), signal.Signals[f"SIG{name}"] if name else signal.SIGKILL)
