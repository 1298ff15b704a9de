"""`gptforge lock check`: pixi.lock and envs/ against pixi.toml, by pixi's satisfiability rules, the
record store, and the compatibility engine. Each problem is one line."""

from __future__ import annotations

import gc
import json
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

from gptforge.core.versions import cuda_release
from gptforge.lock import exports, pixilock, pypi
from gptforge.lock.build import conda_provided, glibc, location, project_package, pyproject
from gptforge.lock.manifest import Environment, Manifest, PypiSpec
from gptforge.lock.store import Store

CUDA_LIBS = {"cudnn": ("cudnn", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"),
             "nccl": ("nccl", "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
             "nvcc": ("cuda-nvcc-tools", "nvidia-cuda-nvcc")}


@dataclass(frozen=True)
class Problem:
    environment: str
    code: str
    message: str

    def line(self) -> str:
        return f"{self.environment}: {self.message} [{self.code}]"


def _records(lock_path: Path, env_name: str) -> list:
    from rattler import LockFile

    lock = LockFile.from_path(lock_path)
    env = lock.environment(env_name)
    out = [] if env is None else [r for p in env.platforms() for r in env.conda_repodata_records_for_platform(p) or ()]
    del lock, env
    return out


def _vp_matches(spec: str, virtual: list[str]) -> bool:
    name, _, version_spec = spec.partition(" ")
    for vp in virtual:
        vp_name, version, *_ = vp.split("=")
        if vp_name == name:
            return not version_spec.strip() or _version_in(version, version_spec.split(" ")[0])
    return False


def _version_in(version: str, spec: str) -> bool:
    from rattler import Version as RVersion, VersionSpec

    return VersionSpec(spec).matches(RVersion(version))


def conda_problems(manifest: Manifest, env: Environment, section: dict, store: Store, lock_path: Path) -> list[Problem]:
    from rattler import MatchSpec

    out = []
    names = pixilock.lock_platform_names(manifest)
    if [c["url"] for c in section.get("channels", [])] != list(manifest.channels):
        out.append(Problem(env.name, "channels", f"channels {section.get('channels')} differ from the manifest's"))
    if list(section.get("packages", {})) != [names[env.platform.name]]:
        out.append(Problem(env.name, "platform", f"locked for {list(section.get('packages', {}))}, "
                                                 f"the manifest says {names[env.platform.name]}"))
    records = _records(lock_path, env.name)
    by_name = {r.name.normalized: r for r in records}
    for spec in env.conda_specs():
        if not any(MatchSpec(spec).matches(r) for r in records):
            found = by_name.get(spec.split(" ")[0])
            out.append(Problem(env.name, "spec-unsatisfied", f"manifest spec '{spec}' is not satisfied by the lock"
                                                              + (f" (locked: {found.version} {found.build})" if found else "")))
    virtual = env.platform.virtual_packages()
    for r in records:
        for dep in r.depends:
            if dep.startswith("__"):
                if not _vp_matches(dep, virtual):
                    out.append(Problem(env.name, "virtual-package", f"{r.name.normalized} {r.version} needs {dep}"))
            elif not any(MatchSpec(dep).matches(o) for o in records):
                out.append(Problem(env.name, "missing-dependency",
                                   f"{r.name.normalized} {r.version} depends on '{dep}', which no locked package satisfies"))
    reach, todo = set(), [s.split(" ")[0] for s in env.conda_specs()]
    while todo:
        n = todo.pop()
        if n not in reach and n in by_name:
            reach.add(n)
            todo += [d.split(" ")[0] for d in by_name[n].depends]
    out += [Problem(env.name, "too-many-conda", f"{n} is locked but nothing in the manifest needs it")
            for n in sorted(set(by_name) - reach)]
    stored = store.records()
    for r in records:
        known = stored.get(r.url)
        if known is None or known.sha256 != r.sha256.hex():
            out.append(Problem(env.name, "unrecorded", f"{r.url} is not a recorded public record"
                                                       + (" (sha256 differs)" if known else "")))
    del records, by_name
    gc.collect()
    return out


def pypi_problems(manifest: Manifest, env: Environment, lock: dict, store: Store) -> list[Problem]:
    out = []
    conda, locked = exports.env_packages(lock, env.name)
    conda_json = [json.dumps({"name": exports.conda_name_version(c)[0], "version": exports.conda_name_version(c)[1]})
                  for c in conda]
    provided = conda_provided(conda_json, store)
    python = next(exports.conda_name_version(c)[1] for c in conda if exports.conda_name_version(c)[0] == "python")
    if locked and lock["environments"][env.name].get("indexes") != list(manifest.indexes):
        out.append(Problem(env.name, "indexes", "PyPI indexes differ from the manifest's"))
    by_name = {canonicalize_name(p["name"]): p for p in locked}
    out += _closure_problems(env, by_name, provided, python)
    out += _file_problems(env, locked, python)
    project = next((s for s in env.pypi.values() if s.path), None)
    if project:
        out += editable_problems(manifest, env, project, next((p for p in locked if p["pypi"] == location(project)), None))
    return out


def _closure_problems(env: Environment, by_name: dict, provided: dict[str, str], python: str) -> list[Problem]:
    """pixi's walk from the manifest's PyPI specs (with their extras) through the locked requires_dist:
    every requirement met inside the lock, and every locked package reached by it."""
    out, reach = [], set()
    versions = {**provided, **{n: str(p["version"]) for n, p in by_name.items()}}

    def requires_of(name: str) -> tuple[str, ...] | None:
        return tuple(by_name[name].get("requires_dist", ())) if name in by_name else None

    roots = [s.requirement for s in env.pypi.values()]
    for text, parent in pypi.closure(roots, pypi.environment_markers(python), requires_of):
        reach.add(canonicalize_name(Requirement(text).name))
        if (why := pypi.unsatisfied(text, versions)) and parent is None:
            out.append(Problem(env.name, "spec-unsatisfied", f"manifest PyPI spec '{text}' is not satisfied ({why})"))
        elif why:
            p = by_name[canonicalize_name(parent)]
            out.append(Problem(env.name, "missing-dependency", f"{p['name']} {p['version']} requires '{text}' ({why})"))
    out += [Problem(env.name, "too-many-pypi", f"{n} is locked but nothing in the manifest needs it")
            for n in sorted(set(by_name) - reach)]
    return out


def _file_problems(env: Environment, locked: list[dict], python: str) -> list[Problem]:
    out, tags = [], set(pypi.python_tags(python, glibc(env)))
    for p in locked:
        if p.get("requires_python") and not SpecifierSet(p["requires_python"]).contains(python):
            out.append(Problem(env.name, "requires-python", f"{p['name']} requires Python {p['requires_python']}, locked {python}"))
        filename = p["pypi"].rsplit("/", 1)[-1].replace("%2B", "+")
        if filename.endswith(".whl") and not set(parse_wheel_filename(filename)[3]) & tags:
            out.append(Problem(env.name, "wheel-tags", f"{filename} does not install on glibc {glibc(env)} / Python {python}"))
    return out


def editable_problems(manifest: Manifest, env: Environment, spec: PypiSpec, have: dict | None) -> list[Problem]:
    """The path dependency's locked metadata against its pyproject.toml, as pixi compares them: the
    requires_dist as sets (every optional-dependencies group included), version, requires_python;
    and every extra the manifest asks for declared there."""
    want = project_package(manifest, spec)
    if have is None:
        return [Problem(env.name, "editable-metadata", f"{spec.name} ({want.location}) is not locked")]
    where = f"{spec.name}'s locked metadata"
    locked = {pypi.format_requirement(r) for r in have.get("requires_dist", ())}
    out = [Problem(env.name, "editable-metadata", f"{where} lacks '{r}' (pyproject.toml has it)")
           for r in want.requires_dist if r not in locked]
    out += [Problem(env.name, "editable-metadata", f"{where} has '{r}', which pyproject.toml does not")
            for r in sorted(locked - set(want.requires_dist))]
    for field, wanted, got in (("version", want.version, str(have["version"])),
                               ("requires_python", want.requires_python, have.get("requires_python"))):
        if wanted != got:
            out.append(Problem(env.name, "editable-metadata", f"{where} has {field} {got}, pyproject.toml {wanted}"))
    declared = {canonicalize_name(e) for e in pyproject(manifest, spec).get("optional-dependencies", {})}
    out += [Problem(env.name, "unknown-extra", f"pixi.toml asks for {spec.name}[{e}], which pyproject.toml does not declare")
            for e in spec.extras if canonicalize_name(e) not in declared]
    return out


def _cuda_of_torch(conda: list[dict], locked: list[dict]) -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built for, from its conda build string or its PyPI requires."""
    for c in conda:
        name, version, build = exports.conda_name_version(c)
        if name == "pytorch":
            m = re.match(r"cuda(\d+)(\d)_", build)
            return version, f"{m.group(1)}.{m.group(2)}" if m else None
    for p in locked:
        if canonicalize_name(p["name"]) == "torch":
            for text in p.get("requires_dist", []):
                req = Requirement(text)
                if req.name.startswith("nvidia-cuda-runtime"):
                    spec = next(iter(req.specifier), None)
                    return str(p["version"]), str(cuda_release(spec.version)) if spec else None
            return str(p["version"]), None
    return None, None


def compat_problems(env: Environment, lock: dict) -> list[Problem]:
    from gptforge.compat import Combination, Severity, check

    conda, locked = exports.env_packages(lock, env.name)
    versions = {exports.conda_name_version(c)[0]: exports.conda_name_version(c)[1] for c in conda}
    versions.update({canonicalize_name(p["name"]): str(p["version"]) for p in locked})
    pick = {key: next((versions[n] for n in names if n in versions), None) for key, names in CUDA_LIBS.items()}
    torch, torch_cuda = _cuda_of_torch(conda, locked)
    out = []
    if env.platform.cuda and pick["nvcc"] and torch_cuda and cuda_release(pick["nvcc"]) != cuda_release(torch_cuda):
        out.append(Problem(env.name, "nvcc-torch-mismatch", f"torch's CUDA {torch_cuda} differs from nvcc {pick['nvcc']}"))
    if env.platform.cuda and torch_cuda and cuda_release(torch_cuda) != cuda_release(env.platform.cuda):
        out.append(Problem(env.name, "cuda-build", f"torch is built for CUDA {torch_cuda}, the platform declares {env.platform.cuda}"))
    combo = Combination(cuda=pick["nvcc"] if env.platform.cuda else None, torch=torch,
                        torch_cuda=torch_cuda if env.platform.cuda else None, python=versions.get("python"),
                        gcc=versions.get("gcc_impl_linux-64"), cudnn=pick["cudnn"], nccl=pick["nccl"])
    out += [Problem(env.name, f.code, f.message) for f in check(combo) if f.severity is Severity.ERROR]
    return out


def export_problems(manifest: Manifest, lock: dict, root: Path) -> list[Problem]:
    out = []
    for rel, text in exports.render_all(manifest, lock).items():
        path = root / rel
        if not path.is_file() or path.read_text() != text:
            out.append(Problem(rel.split("/")[1], "export-stale", f"{rel} differs from pixi.lock (run: pixi run lock)"))
    exported = {e.name for e in manifest.exported()}
    for extra in sorted(p for p in (root / "envs").glob("*/conda-lock.yml") if p.parent.name not in exported):
        out.append(Problem(extra.parent.name, "export-extra", f"envs/{extra.parent.name}/ is not the export of any "
                                                              "environment (delete it; the lock builder deletes nothing)"))
    return out


def check(manifest: Manifest, store: Store, root: Path | None = None) -> list[Problem]:
    root = Path(root or manifest.root)
    lock_path = root / "pixi.lock"
    lock = pixilock.read(lock_path)
    out = []
    if lock.get("version") != 7:
        out.append(Problem("-", "lock-version", f"pixi.lock is version {lock.get('version')}, pixi 0.77 writes 7"))
    for env in manifest.environments.values():
        section = lock.get("environments", {}).get(env.name)
        if section is None:
            out.append(Problem(env.name, "missing-environment", "not in pixi.lock (run: pixi run lock)"))
            continue
        out += conda_problems(manifest, env, section, store, lock_path)
        out += pypi_problems(manifest, env, lock, store)
        out += compat_problems(env, lock)
    return out + export_problems(manifest, lock, root)
