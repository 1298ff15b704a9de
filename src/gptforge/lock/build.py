"""Solve every environment of pixi.toml and write pixi.lock and envs/<env>/ (the offline builder)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from gptforge.errors import GptforgeError
from gptforge.lock import exports, pixilock, pypi, solve
from gptforge.lock.manifest import Environment, Manifest
from gptforge.lock.store import Store, pypi_names


@dataclass(frozen=True)
class EnvReport:
    name: str
    conda: int
    pypi: int
    seconds: float
    pypi_source: str        # "resolved" (uv + registry) or "kept" (the committed lock still satisfies)


def project_package(manifest: Manifest, location: str) -> pypi.PypiPackage:
    """The editable project as pixi locks it: its pyproject metadata, no hash."""
    project = tomllib.loads((manifest.root / "pyproject.toml").read_text())["project"]
    requires = tuple(pypi.format_requirement(r) for r in project.get("dependencies", ()))
    return pypi.PypiPackage(project["name"], project["version"], location, None, requires,
                            project.get("requires-python"))


def conda_provided(records_json: list[str], store: Store) -> dict[str, str]:
    """PyPI name -> version of each Python distribution the conda part installs (pixi's mapping)."""
    mapping = pypi_names(store)
    out = {}
    for rec in map(json.loads, records_json):
        for name in mapping.get(rec["name"], ()):
            out[canonicalize_name(name)] = rec["version"]
    return out


def resolve_pypi(manifest: Manifest, env: Environment, python: str, provided: dict[str, str],
                 wheel_dir: Path | None) -> list[pypi.PypiPackage]:
    project = next((s for s in env.pypi.values() if s.path), None)
    own = project_package(manifest, _location(project.path)) if project else None
    roots = [s.requirement for s in env.pypi.values() if not s.path] + list(own.requires_dist if own else ())
    local = {canonicalize_name(s.name): _local_wheel(s, wheel_dir, python) for s in env.pypi.values() if s.index}
    uv_roots = [r for r in roots if canonicalize_name(r.split("=")[0].split(">")[0].split("<")[0]) not in local]
    uv_roots += [f"{n} @ {Path(p.location).as_uri()}" for n, p in ((n, w[1]) for n, w in local.items())]
    pins = pypi.uv_compile(uv_roots, [f"{n}=={v}" for n, v in provided.items()], python)
    markers = pypi.environment_markers(python)
    tags = pypi.python_tags(python, glibc(env))
    packages, todo, seen = {}, [(r, set()) for r in roots], set()
    while todo:
        text, _ = todo.pop()
        req = pypi.Requirement(text)
        name = canonicalize_name(req.name)
        if not pypi.applies(text, markers) or name in provided or (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name not in packages:
            packages[name] = local[name][0] if name in local else pypi.registry_package(
                manifest.indexes[0], name, pins[name], tags)
        extras = set(req.extras)
        todo += [(r, extras) for r in packages[name].requires_dist if pypi.applies(r, markers, extras or {""})]
    found = sorted(packages.values(), key=lambda p: p.name)
    return found + ([own] if own else [])


def glibc(env: Environment) -> str:
    return next(v.split("=")[1] for v in env.platform.virtual_packages() if v.startswith("__glibc="))


def _location(path: str) -> str:
    return "./" if path in (".", "./") else path


def _local_wheel(spec, wheel_dir: Path | None, python: str):
    if wheel_dir is None:
        raise GptforgeError(f"{spec.name}: its index {spec.index} is only reachable with --wheel-dir",
                            "pass --wheel-dir DIR holding that index's wheel")
    tags = set(pypi.python_tags(python, "2.28"))
    for path in sorted(Path(wheel_dir).glob("*.whl")):
        name, version, _, wheel_tags = pypi.parse_wheel_filename(path.name)
        if canonicalize_name(str(name)) == canonicalize_name(spec.name) and wheel_tags & tags \
                and pypi.Requirement(f"x{spec.version}").specifier.contains(version):
            pkg = pypi.local_wheel(path, spec.index)
            return pkg, pypi.PypiPackage(pkg.name, pkg.version, str(path), pkg.sha256, (), None)
    raise GptforgeError(f"{spec.name}{spec.version}: no fitting wheel in {wheel_dir}", "add the wheel")


def locked_pypi(lock: dict | None, env_name: str) -> list[pypi.PypiPackage] | None:
    if not lock or env_name not in lock.get("environments", {}):
        return None
    by_location = {p["pypi"]: p for p in lock["packages"] if "pypi" in p}
    locations = [e["pypi"] for pkgs in lock["environments"][env_name]["packages"].values() for e in pkgs if "pypi" in e]
    return [pypi.PypiPackage(p["name"], str(p["version"]), p["pypi"], p.get("sha256"),
                             tuple(p.get("requires_dist", ())), p.get("requires_python"))
            for p in (by_location[loc] for loc in locations)]


def build(manifest: Manifest, store: Store, *, refresh_pypi: bool = False, wheel_dir: Path | None = None,
          out_root: Path | None = None) -> list[EnvReport]:
    """Write pixi.lock and envs/<env>/* under out_root (default: beside the manifest)."""
    out_root = Path(out_root or manifest.root)
    previous = pixilock.read(out_root / "pixi.lock") if (out_root / "pixi.lock").is_file() else None
    solved, reports = {}, []
    for env in manifest.environments.values():
        conda = solve.solve(store, env)
        records = [r.to_json() for r in conda.records]
        python = next(json.loads(r)["version"] for r in records if json.loads(r)["name"] == "python")
        kept = None if refresh_pypi else locked_pypi(previous, env.name)
        packages = kept if kept is not None else resolve_pypi(
            manifest, env, python, conda_provided(records, store), wheel_dir)
        solved[env.name] = (records, packages)
        reports.append(EnvReport(env.name, len(records), len(packages), conda.seconds,
                                 "kept" if kept is not None else "resolved"))
        del conda
    doc = pixilock.assemble(manifest, solved)
    pixilock.write(out_root / "pixi.lock", doc)
    exports.write_all(manifest, pixilock.read(out_root / "pixi.lock"), out_root)
    return reports
