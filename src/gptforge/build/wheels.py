"""The tail every native build shares: the wheel from the shared cache (built there once when missing),
then installed into this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from gptforge.build.cache import WheelCache
from gptforge.errors import GptforgeError


def install_wheel(wheel: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall",
                          "--disable-pip-version-check", "-q", str(wheel)], capture_output=True, text=True)
    if out.returncode != 0:
        raise GptforgeError(f"installing {wheel.name} failed: {out.stderr.strip().splitlines()[-1:]}",
                            f"try: {sys.executable} -m pip install --force-reinstall {wheel}")


def cached_wheel(kind: str, cache_root: Path, key: str, inputs: dict, build: Callable[[Path, Path], Path], *,
                 force: bool, quiet: bool, install: bool) -> dict:
    """``build(workdir, log) -> wheel`` runs only when the cache misses (once across builders sharing it)."""
    cache = WheelCache(cache_root, kind)
    log = cache.log_path(key)
    announce = (lambda text: None) if quiet else (lambda text: print(f"{kind}: {text}", file=sys.stderr, flush=True))
    announce(f"cache key {key} in {cache.dir}; build log (when it builds): {log}")

    def on_wait(lock: Path) -> None:
        announce(f"another process is building this key (lock {lock}); waiting for its wheel")

    entry = cache.get_or_build(key, inputs, lambda work: build(work, log), force=force, log=log, on_wait=on_wait)
    announce(f"{'built' if entry.built_here else 'cached'} wheel {entry.wheel}")
    if install:
        install_wheel(entry.wheel)
        announce(f"installed {entry.wheel.name} into {sys.prefix}")
    return {"wheel": str(entry.wheel), "built": entry.built_here, "entry": str(entry.path),
            "build_seconds": entry.meta.get("build_seconds"), "log": str(entry.path / "build.log")}
