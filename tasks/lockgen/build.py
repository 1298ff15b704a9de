"""Solve every environment of pixi.toml and write pixi.lock and envs/<env>/ (the offline builder)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name

from gptforge.errors import GptforgeError
from gptforge.lock import lockfile
from gptforge.lock.manifest import Environment, Manifest, PypiSpec, pyproject
from gptforge.lock.pypi import pyproject_requires_dist
from gptforge.lock.store import Store
from lockgen import pypi, solve, writer
from lockgen.records import pypi_names


@dataclass(frozen=True)
class EnvReport:
    name: str
    conda: int
    pypi: int
    seconds: float
    pypi_source: str        # "resolved" (uv + registry) or "kept" (the committed lock still satisfies)


def project_package(manifest: Manifest, spec: PypiSpec) -> pypi.PypiPackage:
    """A path dependency (the project itself) as pixi locks it: its pyproject metadata with every
    optional-dependencies group, no hash."""
    project = pyproject(manifest, spec)
    return pypi.PypiPackage(project["name"], project["version"], location(spec), None,
                            pyproject_requires_dist(project), project.get("requires-python"))


def location(spec: PypiSpec) -> str:
    return "./" if spec.path in (".", "./") else spec.path


def conda_provided(records_json: list[str], store: Store) -> dict[str, str]:
    """PyPI name -> version of each Python distribution the conda part installs (pixi's mapping)."""
    mapping = pypi_names(store)
    out = {}
    for rec in map(json.loads, records_json):
        for name in mapping.get(rec["name"], ()):
            out[canonicalize_name(name)] = rec["version"]
    return out


def resolve_pypi(manifest: Manifest, env: Environment, python: str, provided: dict[str, str],
                 wheel_dir: Path | None, preferences: Sequence[str] = ()) -> list[pypi.PypiPackage]:
    """uv pins the versions (the project given to it with its extras, as pixi does; PREFERENCES, the locked
    `name==version`s, kept where they still fit); the walk from the manifest's specs then takes each pinned
    package's file and metadata from its index."""
    project = _project_spec(env)
    local = {canonicalize_name(s.name): _local_wheel(s, wheel_dir, python) for s in env.pypi.values() if s.index}
    uv_roots = [s.requirement for s in env.pypi.values() if not s.path and not s.index]
    uv_roots += [f"{n} @ {Path(w[1].location).as_uri()}" for n, w in local.items()]
    if project:
        uv_roots.append(f"{project.requirement} @ {(manifest.root / project.path).resolve().as_uri()}")
    pins = pypi.uv_compile(uv_roots, [f"{n}=={v}" for n, v in provided.items()], python, preferences)
    tags = pypi.python_tags(python, glibc(env))
    packages = {canonicalize_name(project.name): project_package(manifest, project)} if project else {}

    def requires_of(name: str) -> tuple[str, ...] | None:
        if name in provided:
            return None
        if name not in packages:
            packages[name] = local[name][0] if name in local else pypi.registry_package(
                manifest.indexes[0], name, pins[name], tags)
        return packages[name].requires_dist

    for _ in pypi.closure([s.requirement for s in env.pypi.values()], pypi.environment_markers(python), requires_of):
        pass
    return sorted(packages.values(), key=lambda p: p.name)


def _project_spec(env: Environment) -> PypiSpec | None:
    return next((s for s in env.pypi.values() if s.path), None)


def glibc(env: Environment) -> str:
    return next(v.split("=")[1] for v in env.platform.virtual_packages() if v.startswith("__glibc="))


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
                             tuple(p.get("requires_dist", ())), p.get("requires_python"), p.get("index"))
            for p in (by_location[loc] for loc in locations)]


def with_indexes(env: Environment, packages: list[pypi.PypiPackage]) -> list[pypi.PypiPackage]:
    """Each package the manifest pins to an index carries that index, as pixi locks it."""
    pinned = {canonicalize_name(s.name): s.index for s in env.pypi.values() if s.index}
    return [replace(p, index=pinned.get(canonicalize_name(p.name))) for p in packages]


def with_purls(records_json: list[str], store: Store) -> list[str]:
    """Every conda record with the PyPI names it installs, as pixi writes them from the conda-forge
    mapping (`pkg:pypi/NAME?source=compressed-mapping`; empty where it installs none)."""
    mapping = pypi_names(store)
    out = []
    for text in records_json:
        rec = json.loads(text)
        rec["purls"] = [f"pkg:pypi/{n}?source=compressed-mapping" for n in mapping.get(rec["name"], ())]
        out.append(json.dumps(rec))
    return out


def registry_pins(locked: list[pypi.PypiPackage] | None) -> list[str]:
    """`name==version` of each locked package an index served (not the project's own path)."""
    return [f"{p.name}=={p.version}" for p in locked or () if p.location.startswith(("https://", "http://"))]


def keep_pypi(manifest: Manifest, env: Environment, locked: list[pypi.PypiPackage] | None, python: str,
              provided: dict[str, str]) -> list[pypi.PypiPackage] | None:
    """The committed PyPI part with the project's metadata read afresh from pyproject.toml (as pixi
    reads a path dependency's), as long as it still satisfies the manifest; else a one-line error."""
    if locked is None:
        return None
    project = _project_spec(env)
    own = project_package(manifest, project) if project else None
    kept = [own if own and p.location == own.location else p for p in locked]
    by_name = {canonicalize_name(p.name): p for p in kept}
    versions = {**provided, **{n: p.version for n, p in by_name.items()}}

    def requires_of(name: str) -> tuple[str, ...] | None:
        return by_name[name].requires_dist if name in by_name else None

    roots = [s.requirement for s in env.pypi.values()]
    for text, parent in pypi.closure(roots, pypi.environment_markers(python), requires_of):
        if why := pypi.unsatisfied(text, versions):
            raise GptforgeError(f"environment {env.name}: the locked PyPI part misses '{text}'"
                                f"{f' (required by {parent})' if parent else ''}: {why}",
                                "re-resolve it: pixi run lock --offline --refresh-pypi")
    return kept


def build(manifest: Manifest, store: Store, *, refresh_pypi: bool = False, upgrade_pypi: bool = False,
          wheel_dir: Path | None = None, out_root: Path | None = None) -> list[EnvReport]:
    """Write pixi.lock and envs/<env>/* under out_root (default: beside the manifest). REFRESH_PYPI re-resolves
    the PyPI part keeping the locked versions where they still fit (what an added dependency needs moves);
    UPGRADE_PYPI re-resolves it to the newest versions that fit."""
    out_root = Path(out_root or manifest.root)
    previous = lockfile.read_document(out_root / "pixi.lock") if (out_root / "pixi.lock").is_file() else None
    solved, reports = {}, []
    for env in manifest.environments.values():
        conda = solve.solve(store, env)
        records = with_purls([r.to_json() for r in conda.records], store)
        python = next(json.loads(r)["version"] for r in records if json.loads(r)["name"] == "python")
        provided = conda_provided(records, store)
        locked = locked_pypi(previous, env.name)
        kept = None if refresh_pypi or upgrade_pypi else keep_pypi(manifest, env, locked, python, provided)
        preferences = [] if upgrade_pypi else registry_pins(locked)
        packages = kept if kept is not None else resolve_pypi(manifest, env, python, provided, wheel_dir, preferences)
        packages = with_indexes(env, packages)
        solved[env.name] = (records, packages)
        reports.append(EnvReport(env.name, len(records), len(packages), conda.seconds,
                                 "kept" if kept is not None else "resolved"))
        del conda
    doc = writer.assemble(manifest, solved)
    writer.write(out_root / "pixi.lock", doc)
    writer.write_exports(manifest, lockfile.read_document(out_root / "pixi.lock"), out_root)
    return reports
