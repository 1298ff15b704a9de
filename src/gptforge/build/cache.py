"""A wheel cache several builders (processes, nodes on a shared filesystem) may use at once.

Layout under the cache root (``--cache DIR``, else ``wheels/`` of the gptforge cache: docs/build.md)::

    <root>/<kind>/<key>/            one finished entry, published by an atomic rename
        <name>-<ver>-<tags>.whl
        entry.json                  the key's inputs, build time, the build log's name
        build.log                   a copy of the log of the build that made it
    <root>/<kind>/logs/<key>-<utc>-<pid>.log   every build's log, kept when a build fails
    <root>/<kind>/<key>.lock        filelock: the builder holding it compiles, the others wait
    <root>/<kind>/.tmp-<key>-<pid>/ work in progress (never read by anyone else)
    <root>/src/apex-<commit>/      apex sources fetched at a pinned commit

The key is the SHA-256 of the canonical JSON of its inputs, so the same inputs give the same key on
every machine and any change of an input gives another key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.reading import read_json
from gptforge.storage import build_once, cache_dir, publish_dir, write_atomic

KEY_LENGTH = 20


def cache_key(inputs: dict) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def default_cache_root() -> Path:
    return cache_dir("wheels")


@dataclass(frozen=True)
class Entry:
    path: Path
    wheel: Path
    meta: dict
    built_here: bool  # False: found in the cache (possibly after waiting for another builder)


class WheelCache:
    def __init__(self, root: Path, kind: str):
        self.dir = Path(root) / kind

    def entry_dir(self, key: str) -> Path:
        return self.dir / key

    def lock_path(self, key: str) -> Path:
        return self.dir / f"{key}.lock"

    def lookup(self, key: str) -> Entry | None:
        path = self.entry_dir(key)
        try:
            meta = read_json(path / "entry.json", expect=dict)
        except FileReadError:  # absent, or damaged (built again: the new entry replaces it whole)
            return None
        name = meta.get("wheel")
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".whl"):
            return None  # a name that leads out of the entry is never installed
        wheel = path / name
        return Entry(path, wheel, meta, False) if wheel.is_file() and not wheel.is_symlink() else None

    def log_path(self, key: str) -> Path:
        """Where the build of ``key`` logs (kept after a failure; copied into the entry on success)."""
        return self.dir / "logs" / f"{key}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"

    def get_or_build(self, key: str, inputs: dict, build: Callable[[Path], Path], *, force: bool = False,
                     log: Path | None = None, on_wait: Callable[[Path], None] | None = None) -> Entry:
        """The entry for ``key``; ``build(workdir) -> wheel`` runs at most once across processes sharing the lock."""
        def unwritable(err: OSError) -> UsageError:
            return UsageError("--cache", f"the wheel cache {self.dir} cannot be created or written: {err.strerror}",
                              "pass --cache DIR (or set GPTFORGE_CACHE) on a writable file system")

        return build_once(self.lock_path(key), lambda: self.lookup(key), lambda: self._build_and_publish(key, inputs, build, log),
                          force=force, on_wait=on_wait, unwritable=unwritable)

    def _build_and_publish(self, key: str, inputs: dict, build: Callable[[Path], Path], log: Path | None) -> Entry:
        # We hold the key's lock: any work dir of this key belongs to a builder that died (the kernel
        # released its lock), so it is removed rather than left to pile up.
        for stale in self.dir.glob(f".tmp-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = self.dir / f".tmp-{key}-{os.getpid()}"
        work.mkdir(parents=True)
        started = time.time()
        try:
            wheel = Path(build(work))
            if not wheel.is_file():
                raise GptforgeError(f"the build reported {wheel} but wrote no such wheel", "see the build log")
            stage = work / "entry"
            stage.mkdir()
            os.replace(wheel, stage / wheel.name)
            if log is not None and log.is_file():
                shutil.copy2(log, stage / "build.log")
            meta = {"key": key, "inputs": inputs, "wheel": wheel.name, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "build_seconds": round(time.time() - started, 1), "host": os.uname().nodename}
            write_atomic(stage / "entry.json", json.dumps(meta, indent=2, sort_keys=True).encode())
            final = self.entry_dir(key)
            publish_dir(stage, final, replace=True)  # --force over an old entry swaps it out whole
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return Entry(final, final / meta["wheel"], meta, True)
