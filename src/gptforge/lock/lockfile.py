"""pixi.lock (formats 4 to 7) read as rattler_lock 0.32 reads it, with its defaults: what the
satisfiability rules see. Reading runs nothing: plain YAML data, bounded (lock/files.py)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from gptforge.errors import GptforgeError
from gptforge.lock.files import read_yaml
from gptforge.lock.workspace import DEFAULT_INDEX, Unsupported

# rattler_lock/src/options.rs: SolveOptions' serde defaults
DEFAULT_OPTIONS = {"strategy": "highest", "channel-priority": "strict",
                   "pypi-prerelease-mode": "if-necessary-or-explicit"}
FIX = "regenerate it (pixi lock), or restore it from git"


@dataclass(frozen=True)
class CondaPackage:
    url: str
    data: dict          # the record's fields (name, version, build, depends, ...)
    purls: tuple[str, ...] | None

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def file_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def record(self):
        """The rattler PackageRecord, for MatchSpec.matches."""
        from rattler import PackageRecord
        from rattler.package.build_string import BuildString  # noqa: F401 (py-rattler wants the wrapper)

        d = self.data
        return PackageRecord(d["name"], str(d["version"]), BuildString(str(d["build"])), int(d.get("build_number", 0)),
                             d["subdir"], depends=list(d.get("depends", ())), constrains=list(d.get("constrains", ())),
                             extra_depends=d.get("extra_depends") or None)

    def is_conda_forge(self) -> bool:
        """pypi_mapping/src/channel.rs is_conda_forge_url: the channel's path starts with /conda-forge."""
        return urllib.parse.urlsplit(self.url).path.startswith("/conda-forge")


@dataclass(frozen=True)
class PypiPackage:
    name: str                       # canonical
    version: str | None
    location: str
    is_path: bool
    index_url: str | None
    requires_dist: tuple[str, ...]
    requires_python: str | None

    @property
    def file_name(self) -> str:
        return urllib.parse.unquote(self.location.rstrip("/").rsplit("/", 1)[-1])


@dataclass(frozen=True)
class LockPlatform:
    name: str
    subdir: str
    virtual_packages: tuple[str, ...]


@dataclass
class LockEnvironment:
    channels: list[str]
    indexes: dict | None            # {"indexes": [...], "find-links": [...]} or None
    options: dict
    packages: dict[str, list] = field(default_factory=dict)   # lock platform name -> packages


@dataclass
class Lock:
    version: int
    platforms: dict[str, LockPlatform]
    environments: dict[str, LockEnvironment]


def _need(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise GptforgeError(f"{path}: {what}", FIX)


def _split_file_name(file_name: str) -> tuple[str, str, str]:
    stem = file_name.removesuffix(".conda").removesuffix(".tar.bz2")
    name, version, build = stem.rsplit("-", 2)
    return name, version, build


def _conda(entry: dict, path: Path) -> CondaPackage:
    url = entry.get("conda") or entry.get("url")
    _need(isinstance(url, str), path, "a conda package without a URL")
    if "://" not in url:
        raise Unsupported(f"{path}: conda package {url} is a source package (a source build)",
                          "check this workspace with pixi itself")
    data = dict(entry)
    try:
        name, version, build = _split_file_name(url.rsplit("/", 1)[-1])
    except ValueError:
        raise GptforgeError(f"{path}: conda package URL {url} does not name a package file", FIX) from None
    data.setdefault("name", name)
    data.setdefault("version", version)
    data.setdefault("build", build)
    data.setdefault("subdir", url.rsplit("/", 2)[-2])
    purls = entry.get("purls")
    _need(purls is None or isinstance(purls, list), path, f"{url}: purls is not a list")
    return CondaPackage(url, data, None if purls is None else tuple(str(p) for p in purls))


def _pypi(entry: dict, version: int, env_indexes: dict | None, path: Path) -> PypiPackage:
    location = entry.get("pypi") or entry.get("url") or entry.get("path")
    _need(isinstance(location, str) and isinstance(entry.get("name"), str), path,
          "a PyPI package without a name or location")
    is_path = "://" not in location
    index = None
    if version >= 7 and not is_path:
        # rattler_lock lib.rs (v7_pypi_default_index_from_environment): a wheel without `index:`
        # came from the environment's first index, else https://pypi.org/simple
        first = (env_indexes or {}).get("indexes") or [DEFAULT_INDEX]
        index = entry.get("index") or first[0]
    pkg_version = entry.get("version")
    return PypiPackage(canonicalize_name(entry["name"]), None if pkg_version is None else str(pkg_version),
                       location, is_path, index, tuple(map(str, entry.get("requires_dist") or ())),
                       None if entry.get("requires_python") is None else str(entry["requires_python"]))


def read_document(path: Path) -> dict:
    """pixi.lock as the plain YAML mapping it is."""
    doc = read_yaml(Path(path), "pixi.lock")
    if not isinstance(doc, dict):
        raise GptforgeError(f"{path}: not a YAML mapping at the top level", "regenerate it: pixi run lock")
    return doc


def read(path: Path) -> Lock:
    doc = read_document(path)
    version = doc.get("version")
    _need(isinstance(version, int), path, f"no integer version (found {str(version)[:40]!r})")
    if not 4 <= version <= 7:
        raise GptforgeError(f"{path}: lock format version {version} is not one pixi 0.77 reads (4 to 7)", FIX)
    packages = doc.get("packages") or []
    envs = doc.get("environments") or {}
    _need(isinstance(packages, list) and isinstance(envs, dict), path, "packages is not a list or environments not a mapping")
    platforms = {}
    for p in doc.get("platforms") or []:
        _need(isinstance(p, dict) and isinstance(p.get("name"), str), path, "a platform without a name")
        platforms[p["name"]] = LockPlatform(p["name"], p.get("subdir") or p["name"],
                                            tuple(map(str, p.get("virtual-packages") or ())))
    by_conda, by_pypi = {}, {}
    for entry in packages:
        _need(isinstance(entry, dict), path, "a package entry that is not a mapping")
        if "source" in entry:
            raise Unsupported(f"{path}: holds source packages (a source build)", "check this workspace with pixi itself")
        if entry.get("kind") == "pypi" or "pypi" in entry:
            by_pypi[entry.get("pypi") or entry.get("url") or entry.get("path")] = entry
        else:
            by_conda.setdefault(entry.get("conda") or entry.get("url"), []).append(entry)
    out = {}
    for env_name, env in envs.items():
        _need(isinstance(env, dict) and isinstance(env.get("packages", {}), dict), path, f"environment {env_name} is malformed")
        indexes = {k: env[k] for k in ("indexes", "find-links") if k in env} or None
        lock_env = LockEnvironment([c["url"] if isinstance(c, dict) else str(c) for c in env.get("channels") or []],
                                   indexes, {**DEFAULT_OPTIONS, **(env.get("options") or {})})
        for platform_name, selectors in (env.get("packages") or {}).items():
            if version < 7:
                platforms.setdefault(platform_name, LockPlatform(platform_name, platform_name, ()))
            _need(platform_name in platforms, path, f"environment {env_name} names unknown platform {platform_name}")
            lock_env.packages[platform_name] = [_select(s, version, indexes, by_conda, by_pypi, path, env_name)
                                                for s in selectors or ()]
        out[env_name] = lock_env
    return Lock(version, platforms, out)


def _select(selector, version, indexes, by_conda, by_pypi, path, env_name):
    _need(isinstance(selector, dict), path, f"environment {env_name}: a package selector that is not a mapping")
    if "source" in selector:
        raise Unsupported(f"{path}: holds source packages (a source build)", "check this workspace with pixi itself")
    if "pypi" in selector:
        entry = by_pypi.get(selector["pypi"])
        _need(entry is not None, path, f"environment {env_name} names {selector['pypi']}, which packages lacks")
        return _pypi(entry, version, indexes, path)
    url = selector.get("conda")
    candidates = by_conda.get(url) or []
    if not candidates and isinstance(url, str) and "://" not in url:
        raise Unsupported(f"{path}: conda package {url} is a source package (a source build)",
                          "check this workspace with pixi itself")
    _need(bool(candidates), path, f"environment {env_name} names {url}, which packages lacks")
    # v7 package_selector.rs: several entries of one URL are told apart by the selector's fields
    entry = next((c for c in candidates if all(c.get(k) == v for k, v in selector.items() if k != "conda")),
                 candidates[0])
    return _conda(entry, path)
