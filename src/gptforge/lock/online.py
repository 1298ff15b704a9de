"""`gptforge lock check --online`: every locked PyPI sha256 against its registry's simple API (no downloads)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from gptforge.errors import GptforgeError
from gptforge.lock import exports, pypi
from gptforge.lock.check import Problem
from gptforge.lock.manifest import Manifest

PYPI_FILES = "files.pythonhosted.org"


@dataclass
class OnlineReport:
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)   # one line each: what and why


def _index_of(manifest: Manifest, env_name: str, name: str) -> str | None:
    spec = manifest.environments[env_name].pypi.get(name)
    return spec.index if spec and spec.index else None


def check_online(manifest: Manifest, lock: dict) -> OnlineReport:
    report, pages, seen = OnlineReport(), {}, set()
    for env_name in manifest.environments:
        _, locked = exports.env_packages(lock, env_name)
        for p in locked:
            if not p.get("sha256") or p["pypi"] in seen:
                continue
            seen.add(p["pypi"])
            host = urllib.parse.urlparse(p["pypi"]).netloc
            index = manifest.indexes[0] if host == PYPI_FILES else _index_of(manifest, env_name, p["name"])
            filename = urllib.parse.unquote(p["pypi"].rsplit("/", 1)[1])
            key = (index, p["name"])
            if key not in pages:
                try:
                    pages[key] = {f["filename"]: f["hashes"].get("sha256") for f in pypi.simple_files(index, p["name"])}
                except GptforgeError as err:
                    pages[key] = err.message
            page = pages[key]
            if isinstance(page, str):
                report.unverifiable.append(f"{env_name}: {filename}: not checkable from here ({page})")
                continue
            report.checked += 1
            if page.get(filename) != p["sha256"]:
                why = "not on the index" if filename not in page else f"registry says {page[filename]}"
                report.problems.append(Problem(env_name, "pypi-hash", f"{filename}: locked sha256 {p['sha256']}, {why}"))
    return report
