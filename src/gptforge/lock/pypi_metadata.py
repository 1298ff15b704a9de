"""pypi_metadata.rs: a local PyPI package's metadata as pixi reads it statically (pyproject.toml,
with uv's [tool.uv.sources]) and compared with what the lock holds for it."""

from __future__ import annotations

import os
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from gptforge.lock import lockfile
from gptforge.lock.workspace import Unsat, Unsupported


def dir_version(pkg: lockfile.PypiPackage, root: Path) -> str | None:
    meta = _static_metadata(pkg, root)
    return meta.get("version") if meta else None


def _static_metadata(pkg: lockfile.PypiPackage, root: Path) -> dict | None:
    """pypi.rs read_local_package_metadata, static part: a local directory's pyproject.toml [project]."""
    if not pkg.is_path:
        return None
    directory = Path(pkg.location if os.path.isabs(pkg.location) else root / pkg.location)
    if not directory.is_dir():
        return None
    from gptforge.lock.files import read_toml

    pyproject = directory / "pyproject.toml"
    doc = read_toml(pyproject, "pyproject.toml") if pyproject.is_file() else {}
    project = doc.get("project")
    if not isinstance(project, dict) or project.get("dynamic"):
        raise Unsupported(f"{directory}: its metadata is dynamic (needs a build)", "check this workspace with pixi itself")
    sources = ((doc.get("tool") or {}).get("uv") or {}).get("sources")
    return {**project, "__uv_sources__": sources} if sources else project


def local_metadata(pkg: lockfile.PypiPackage, root: Path, cache: dict) -> Unsat | None:
    """pypi_metadata.rs compare_metadata: requires_dist as sets (self-extras expanded), version, requires_python."""
    project = _static_metadata(pkg, root)
    if project is None:
        return None
    from gptforge.lock.pypi import pyproject_requires_dist

    current = _expand_self(pyproject_requires_dist(_with_uv_sources(project)), pkg.name)
    have = _expand_self(pkg.requires_dist, pkg.name)
    if current != have:
        added, removed = sorted(current - have), sorted(have - current)
        return Unsat("local-metadata-mismatch", f"metadata for local package '{pkg.name}' has changed: dependencies "
                                                f"changed - added: [{', '.join(added)}], removed: [{', '.join(removed)}]")
    if project.get("version") and pkg.version and Version(project["version"]) != Version(pkg.version):
        return Unsat("local-metadata-mismatch", f"metadata for local package '{pkg.name}' has changed: version "
                                                f"changed from {pkg.version} to {project['version']}")
    want = project.get("requires-python")
    if (SpecifierSet(want) if want else None) != (SpecifierSet(pkg.requires_python) if pkg.requires_python else None):
        return Unsat("local-metadata-mismatch", f"metadata for local package '{pkg.name}' has changed: requires-python "
                                                f"changed from {pkg.requires_python} to {want}")
    return None


def _with_uv_sources(project: dict) -> dict:
    """uv reads a dependency with a [tool.uv.sources] git entry as `name @ git+URL@ref`."""
    sources = project.get("__uv_sources__") or {}
    if not sources:
        return project

    def sourced(text: str) -> str:
        req = Requirement(text)
        src = sources.get(req.name) or sources.get(canonicalize_name(req.name))
        if not isinstance(src, dict) or "git" not in src:
            return text
        ref = src.get("tag") or src.get("rev") or src.get("branch")
        marker = f" ; {req.marker}" if req.marker else ""
        return f"{req.name} @ git+{src['git']}" + (f"@{ref}" if ref else "") + marker

    return {**project, "dependencies": [sourced(t) for t in project.get("dependencies", [])],
            "optional-dependencies": {k: [sourced(t) for t in v]
                                      for k, v in project.get("optional-dependencies", {}).items()}}


def _normal(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    where = f" @ {req.url}" if req.url else ",".join(sorted(str(s) for s in req.specifier))
    return f"{canonicalize_name(req.name)}{extras}{where}" + (f" ; {req.marker}" if req.marker else "")


def _expand_self(requires: tuple[str, ...], name: str) -> set[str]:
    """pypi_metadata.rs expand_self_extras: `pkg[extra]` inside pkg's own requires_dist is replaced
    by that extra's requirements."""
    reqs = [Requirement(r) for r in requires]
    out, todo, done = set(), [r for r in reqs], set()
    while todo:
        req = todo.pop()
        if canonicalize_name(req.name) != name:
            out.add(_normal(req))
            continue
        for extra in req.extras:
            if extra in done:
                continue
            done.add(extra)
            todo += [r for r in reqs if r.marker and f"extra == \"{extra}\"" in str(r.marker)]
    return out
