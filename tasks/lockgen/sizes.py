"""Download size of each environment in pixi.lock: python tasks/lockgen/sizes.py [PIXI_LOCK]

Conda packages: the sum of their `size` fields in the lock. PyPI packages: the lock carries no size,
so each file's size comes from its index's simple JSON (PEP 700 `size`); a file whose index cannot be
reached is counted apart and named. What an environment takes on disk once installed is larger
than its download (archives are compressed).
"""

from __future__ import annotations

import sys
import urllib.parse
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.lock import exports, lockfile, pypi

PYPI_FILES = "files.pythonhosted.org"


def index_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc == PYPI_FILES:
        return "https://pypi.org/simple"
    return f"{parts.scheme}://{parts.netloc}{parts.path.rsplit('/', 1)[0]}"


def pypi_size(entry: dict, pages: dict) -> int | None:
    url = entry["pypi"]
    if "://" not in url:        # the project itself, a local path
        return 0
    key = (index_of(url), entry["name"])
    if key not in pages:
        try:
            pages[key] = {f["filename"]: f.get("size") for f in pypi.simple_files(*key)}
        except GptforgeError:
            pages[key] = {}
    return pages[key].get(urllib.parse.unquote(url.rsplit("/", 1)[1]))


def sizes(lock: dict) -> dict[str, tuple[int, int, list[str]]]:
    """environment -> (conda bytes, PyPI bytes, PyPI files of unknown size)."""
    pages, out = {}, {}
    for name in lock["environments"]:
        conda, locked = exports.env_packages(lock, name)
        conda_bytes = sum(int(c.get("size", 0)) for c in conda)
        pypi_bytes, unknown = 0, []
        for entry in locked:
            size = pypi_size(entry, pages)
            if size is None:
                unknown.append(entry["pypi"])
            else:
                pypi_bytes += size
        out[name] = (conda_bytes, pypi_bytes, unknown)
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pixi.lock")
    for name, (conda_bytes, pypi_bytes, unknown) in sizes(lockfile.read_document(path)).items():
        line = (f"{name}: {(conda_bytes + pypi_bytes) / 1e9:.2f} GB to download "
                f"(conda {conda_bytes / 1e9:.2f} GB, PyPI {pypi_bytes / 1e9:.2f} GB)")
        print(line + "".join(f"; size unknown: {u}" for u in unknown))
