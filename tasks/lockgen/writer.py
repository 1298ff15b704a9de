"""Writing the lock's files: pixi.lock v7 assembled as data, then written by rattler's own lock writer (the
writer pixi uses), so that ordering, field names and defaults are pixi's; envs/<env>/ rendered from it. Each file
is written whole or not at all (a temp name in the same directory, then a rename)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml

from gptforge.lock import exports
from gptforge.lock.manifest import Manifest, Platform
from gptforge.storage import write_atomic


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())


def write_exports(manifest: Manifest, lock: dict, root: Path) -> None:
    for rel, text in exports.render_all(manifest, lock).items():
        write_text(Path(root) / rel, text)


OMIT = ("fn", "url", "channel", "subdir", "name", "version", "build")


def lock_platform_names(manifest: Manifest) -> dict[str, str]:
    """Manifest platform name -> lock name: bare subdirs keep theirs, rich ones are p1, p2... in order."""
    names, n = {}, 0
    for name, platform in manifest.platforms.items():
        if platform.cuda is None and name == platform.subdir:
            names[name] = name
        else:
            n += 1
            names[name] = f"p{n}"
    return names


def conda_entry(record_json: str) -> dict:
    data = json.loads(record_json)
    entry = {"conda": data["url"]}
    entry.update({k: v for k, v in data.items() if k not in OMIT})
    if isinstance(entry.get("track_features"), str):  # repodata's string, the lock's list
        entry["track_features"] = entry["track_features"].replace(",", " ").split()
    return entry


def assemble(manifest: Manifest, solved: dict) -> dict:
    """solved: env name -> (conda record JSON strings, PypiPackages, uses_indexes)."""
    names = lock_platform_names(manifest)
    used = {env.platform.name for env in manifest.environments.values()}
    platforms = [_platform_entry(names[p.name], p) for p in manifest.platforms.values() if p.name in used]
    environments, packages = {}, {}
    for env_name, (conda, pypi) in solved.items():
        env = manifest.environments[env_name]
        entries = [conda_entry(rec) for rec in conda] + [p.to_lock() for p in pypi]
        for entry in entries:
            packages[entry.get("conda") or entry.get("pypi")] = entry
        section = {"channels": [{"url": url} for url in manifest.channels]}
        if pypi:
            section["indexes"] = list(manifest.indexes)
        section["packages"] = {names[env.platform.name]: [{k: e[k]} for e in entries for k in ("conda", "pypi") if k in e]}
        environments[env_name] = section
    return {"version": 7, "platforms": platforms, "environments": environments, "packages": list(packages.values())}


def _platform_entry(lock_name: str, platform: Platform) -> dict:
    entry = {"name": lock_name}
    if lock_name != platform.subdir:
        entry["subdir"] = platform.subdir
    entry["virtual-packages"] = platform.virtual_packages()
    return entry


def render(doc: dict) -> str:
    """The lock's text as rattler writes it."""
    from rattler import LockFile

    with tempfile.TemporaryDirectory() as tmp:
        draft, final = Path(tmp, "draft.lock"), Path(tmp, "pixi.lock")
        draft.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
        lock = LockFile.from_path(draft)
        lock.to_path(final)
        del lock
        return final.read_text()


def write(path: Path, doc: dict) -> str:
    text = render(doc)
    write_text(path, text)
    return text
