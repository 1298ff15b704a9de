"""One environment on one platform: satisfiability/platform.rs verify_platform_satisfiability and
verify_package_platform_satisfiability (the walk from the manifest's specs through the locked
records), with the PyPI rules of satisfiability/pypi.rs and pypi_metadata.rs and the conda -> PyPI
identity of package_identifier.rs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from gptforge.lock import lockfile, workspace as ws
from gptforge.lock.pyplatform import marker_environment
from gptforge.lock.pypi_metadata import dir_version, local_metadata
from gptforge.lock.workspace import Unsat, Unsupported, vp_parts

def lock_platform_for(lock: lockfile.Lock, platform: ws.PixiPlatform) -> lockfile.LockPlatform | None:
    """platform.rs resolve_lock_platform_for: the lock's platform of that name, else the one named
    after its subdir when that one declares what the platform declares (or nothing)."""
    if platform.name in lock.platforms:
        return lock.platforms[platform.name]
    candidate = lock.platforms.get(platform.subdir)
    if candidate and (not candidate.virtual_packages or all(v in candidate.virtual_packages for v in platform.declared)):
        return candidate
    return None


def customised(locked: lockfile.LockPlatform) -> list[str]:
    defaults = set(ws.subdir_defaults(locked.subdir))
    return sorted(v for v in locked.virtual_packages if v not in defaults and f"{v}=0" not in defaults)


PURL_PYPI = re.compile(r"^pkg:pypi/([^@?#]+)(?:@([^?#]+))?")


@dataclass(frozen=True)
class Req:
    """A PyPI requirement as pixi's walk sees it (uv's Requirement, reduced)."""
    name: str
    specifier: str = ""
    extras: tuple[str, ...] = ()
    marker: str | None = None
    index: str | None = None
    path: str | None = None            # absolute, for path and directory requirements
    editable: bool = False
    url: str | None = None

    def text(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        where = f" @ {self.url or self.path}" if (self.url or self.path) else self.specifier
        return f"{self.name}{extras}{where}" + (f" ; {self.marker}" if self.marker else "")

    def applies(self, env: dict, extras=()) -> bool:
        if not self.marker:
            return True
        marker = _marker(self.marker)
        return any(marker.evaluate({**env, "extra": e}) for e in (tuple(extras) or ("",)))


@cache  # a lock's records repeat the same markers and requirement texts on every platform and environment
def _marker(text: str) -> Marker:
    return Marker(text)


@cache
def _from_text(text: str, root: Path) -> Req:
    try:
        req = Requirement(text)
    except InvalidRequirement as err:
        raise Unsat("invalid-requirement", f"the requirement '{text}' failed to parse ({err})") from None
    url = req.url
    path = None
    if url and url.startswith("file://"):
        path, url = url.removeprefix("file://"), None
    return Req(canonicalize_name(req.name), str(req.specifier), tuple(sorted(req.extras)),
               str(req.marker) if req.marker else None, None, path, False, url)


def manifest_req(name: str, spec, root: Path) -> Req:
    """A [pypi-dependencies] entry (pixi_pypi_spec) as a requirement."""
    if isinstance(spec, str):
        return Req(canonicalize_name(name), "" if spec.strip() == "*" else spec)
    if {"git", "url"} & set(spec):
        raise Unsupported(f"pixi.toml: {name} is a git or URL PyPI dependency (needs a checkout)",
                          "check this workspace with pixi itself")
    version = spec.get("version", "*")
    path = os.path.normpath(root / spec["path"]) if "path" in spec else None
    return Req(canonicalize_name(name), "" if version.strip() == "*" else version, tuple(sorted(spec.get("extras", ()))),
               spec.get("env-markers"), spec.get("index"), path, bool(spec.get("editable")))


def conda_spec(name: str, spec) -> str:
    """A [dependencies] entry as a MatchSpec string (pixi_spec: version, build, extras, when)."""
    if isinstance(spec, str):
        return f"{name} {spec}".strip()
    text = f"{name} {spec.get('version', '*')}" + (f" {spec['build']}" if "build" in spec else "")
    brackets = []
    if spec.get("extras"):
        brackets.append(f"extras=[{','.join(spec['extras'])}]")
    if spec.get("when"):
        brackets.append(f'when="{spec["when"]}"')
    return text + (f"[{', '.join(brackets)}]" if brackets else "")


def _matchspec(text: str):
    from rattler import MatchSpec

    try:
        return MatchSpec(text, strict=False)
    except Exception as err:  # rattler's parse errors have no common base class
        raise Unsat("invalid-match-spec", f"the requirement '{text}' failed to parse ({err})") from None


def _virtual_records(platform: ws.PixiPlatform) -> dict:
    from rattler import PackageRecord
    from rattler.package.build_string import BuildString

    out = {}
    for vp in platform.declared:
        name, version, build = vp_parts(vp)
        out[name] = PackageRecord(name, version, BuildString(build or "0"), 0, platform.subdir)
    return out


def _condition_met(condition: str, records, virtual) -> bool:
    """platform.rs condition_is_met: `or` of `and`s of specs, each met by a record or a virtual package."""
    return any(all(_spec_met(part, records, virtual) for part in branch.split(" and "))
               for branch in condition.split(" or "))


def _spec_met(text: str, records, virtual) -> bool:
    spec = _matchspec(text.strip().strip("()"))
    return any(spec.matches(r) for r in records) or any(spec.matches(v) for v in virtual.values())


def pypi_identities(pkg: lockfile.CondaPackage) -> dict[str, str]:
    """package_identifier.rs: the PyPI names (and versions) a conda record installs. No `purls` on a
    conda-forge record means "its conda name is its PyPI name" (backwards compatibility)."""
    if pkg.purls is None:
        return {canonicalize_name(pkg.name): str(pkg.data["version"])} if pkg.is_conda_forge() else {}
    out = {}
    for purl in pkg.purls:
        m = PURL_PYPI.match(purl)
        if m:
            out[canonicalize_name(m.group(1))] = m.group(2) or str(pkg.data["version"])
    return out


def _contains(specifier: str, version: str) -> bool:
    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def verify_platform(workspace: ws.Workspace, env: ws.Environment, platform: ws.PixiPlatform,
                    locked: lockfile.LockEnvironment, lock: lockfile.Lock) -> tuple[set, list]:
    """platform.rs verify_platform_satisfiability; returns (expected conda names, conda names used by PyPI)."""
    lock_platform = lock_platform_for(lock, platform)
    packages = locked.packages.get(lock_platform.name, []) if lock_platform else []
    conda = [p for p in packages if isinstance(p, lockfile.CondaPackage)]
    pypi = [p for p in packages if isinstance(p, lockfile.PypiPackage)]
    pypi_deps = env.pypi_dependencies()
    if pypi_deps and not pypi and all(p.purls is None for p in conda):
        raise Unsat("missing-purls", "missing purls")
    for group in (conda, pypi):
        seen = set()
        for p in group:
            if p.name in seen:
                raise Unsat("duplicate-entry", f"there was a duplicate entry for '{p.name}'")
            seen.add(p.name)
    records = {p.name: p.record() for p in conda}
    by_name = {p.name: p for p in conda}
    pypi_by_name = {p.name: p for p in pypi}
    virtual = _virtual_records(platform)

    python = by_name.get("python")
    markers = marker_environment(platform.subdir, str(python.data["version"])) if python else None
    if pypi_deps and markers is None:
        raise Unsat("missing-python-interpreter",
                    "there are PyPi dependencies but a python interpreter is missing from the lock file")
    pypi_reqs = [r for r in (manifest_req(n, s, workspace.root) for n, s in pypi_deps.items())
                 if markers is None or r.applies(markers)]
    if not pypi_reqs and pypi:
        raise Unsat("too-many-pypi", "there are more pypi packages in the lock file than are used by the "
                                     f"environment: {', '.join(p.name for p in pypi)}")
    for name, spec in env.constraints().items():
        if name in records and not _matchspec(conda_spec(name, spec)).matches(records[name]):
            raise Unsat("constraint-violated", f"the locked package '{name}' ({by_name[name].data['version']}) "
                                               f"violates the constraint '{conda_spec(name, spec)}'")
    overrides = {canonicalize_name(n): manifest_req(n, s, workspace.root)
                 for n, s in env.pypi_options().get("dependency-overrides", {}).items()}
    conda_pypi = {}
    for p in conda:
        for pypi_name, version in pypi_identities(p).items():
            conda_pypi[pypi_name] = (p.name, version)

    conda_deps = env.dependencies()
    if not conda_deps and conda:
        raise Unsat("too-many-conda", "there are more conda packages in the lock file than are used by the environment: ")
    conda_stack = [(conda_spec(n, s), "<environment>", True) for n, s in conda_deps.items()]
    pypi_queue = [(r, "<environment>", "manifest") for r in pypi_reqs]
    pypi_seen = set(pypi_reqs)
    conda_visited, extras_followed, pypi_visited = set(), {}, set()
    expected, used_by_pypi = set(), set()
    delayed: Unsat | None = None
    local_meta: dict[str, dict] = {}

    while conda_stack or pypi_queue:
        if conda_stack:
            text, origin, _ = conda_stack.pop()
            spec = _matchspec(text)
            if spec.condition and not _condition_met(str(spec.condition), records.values(), virtual):
                continue
            name = spec.name.normalized if spec.name else None
            record = records.get(name)
            if record is None or not spec.matches(record):
                if record is None and name in virtual and spec.matches(virtual[name]):
                    continue
                raise Unsat("unsatisfiable-match-spec", f"the requirement '{text}' could not be satisfied (required by '{origin}')")
            expected.add(name)
            found = ("conda", name, list(spec.extras or ()))
        else:
            req, origin, req_origin = pypi_queue.pop()
            if req.name in conda_pypi:
                conda_name, version = conda_pypi[req.name]
                if req.editable:
                    delayed = delayed or Unsat("editable-on-conda", f"editable pypi dependency on conda resolved package '{req.name}' is not supported")
                check = overrides.get(req.name, req)
                if not (check.path or check.url) and not _contains(check.specifier, version):
                    delayed = delayed or Unsat("conda-unsatisfiable-requirement", f"the conda package does not satisfy the pypi requirement '{req.text()}' (required by '{origin}')")
                used_by_pypi.add(conda_name)
                found = ("conda", conda_name, [])
            elif req.name in pypi_by_name:
                req = overrides.get(req.name, req)
                pkg = pypi_by_name[req.name]
                delayed = delayed or _pypi_satisfies(req, pkg, req_origin, locked, workspace.root)
                found = ("pypi", req.name, list(req.extras))
            else:
                delayed = delayed or Unsat("unsatisfiable-requirement", f"the requirement '{req.text()}' could not be satisfied (required by '{origin}')")
                continue

        kind, name, extras = found
        if kind == "conda":
            record = by_name[name]
            walk = list(record.data.get("depends", ())) if name not in conda_visited else []
            conda_visited.add(name)
            followed = extras_followed.setdefault(name, set())
            for extra in extras:
                if extra not in followed:
                    followed.add(extra)
                    walk += (record.data.get("extra_depends") or {}).get(extra, [])
            conda_stack += [(dep, record.file_name, False) for dep in walk]
            continue
        pkg = pypi_by_name[name]
        if name not in pypi_visited:
            pypi_visited.add(name)
            delayed = delayed or local_metadata(pkg, workspace.root, local_meta) or _requires_python(pkg, markers)
        for text in pkg.requires_dist:
            try:
                req = _from_text(text, workspace.root)
            except Unsat as err:
                delayed = delayed or err
                continue
            if req.applies(markers, extras) and req not in pypi_seen:
                pypi_seen.add(req)
                pypi_queue.append((req, pkg.name, "requires-dist"))

    unused = [p.name for p in conda if p.name not in conda_visited]
    if unused:
        raise Unsat("too-many-conda", "there are more conda packages in the lock file than are used by the "
                                      f"environment: {', '.join(unused)}")
    if delayed:
        raise delayed
    unused = [p.name for p in pypi if p.name not in pypi_visited]
    if unused:
        raise Unsat("too-many-pypi", "there are more pypi packages in the lock file than are used by the "
                                     f"environment: {', '.join(unused)}")
    return expected, sorted(used_by_pypi)


def _pypi_satisfies(req: Req, pkg: lockfile.PypiPackage, origin: str, locked: lockfile.LockEnvironment,
                    root: Path) -> Unsat | None:
    """pypi.rs pypi_satisfies_requirement and pypi_satisfies_editable."""
    if req.url and req.url.startswith("git+"):
        # pypi.rs, RequirementSource::Git: the locked URL must be a git URL of the same repository
        repo = re.split(r"[@#?]", req.url.removeprefix("git+").split("://", 1)[1], maxsplit=1)[0]
        have = pkg.location.removeprefix("git+")
        if not pkg.location.startswith("git+") or re.split(r"[@#?]", have.split("://", 1)[-1], maxsplit=1)[0] != repo:
            return Unsat("pypi-git-mismatch", f"'{req.name}' expected a git url but the lock file has: '{pkg.location}'")
        return None
    if req.url:
        raise Unsupported(f"{req.name}: a direct-URL PyPI requirement", "check this workspace with pixi itself")
    if req.path:
        if not pkg.is_path:
            return Unsat("pypi-requires-path", f"'{req.name}' expected a path but the lock file has a url")
        locked_path = os.path.normpath(pkg.location if os.path.isabs(pkg.location) else root / pkg.location)
        if os.path.realpath(locked_path) != os.path.realpath(req.path):
            return Unsat("pypi-path-mismatch", f"'{req.name}' is locked at {pkg.location}, the manifest asks for {req.path}")
        return None
    if origin == "requires-dist" and pkg.is_path:
        return None
    version = pkg.version or dir_version(pkg, root) or "0a0.dev0"
    if req.specifier and not _contains(req.specifier, version):
        return Unsat("pypi-version-mismatch", f"'{req.name}' with specifiers '{req.specifier}' does not match the locked version '{version}'")
    if pkg.index_url is None:
        return None
    if req.index:
        if req.index != pkg.index_url:
            return Unsat("pypi-index-mismatch", f"'{req.name}' requires index {req.index} but the lock file has {pkg.index_url}")
    elif origin == "manifest":
        indexes = list((locked.indexes or {}).get("indexes") or [])
        indexes += [fl["url"] for fl in (locked.indexes or {}).get("find-links") or [] if isinstance(fl, dict) and "url" in fl]
        indexes = indexes or [ws.DEFAULT_INDEX]
        if not any(i.rstrip("/") == pkg.index_url.rstrip("/") for i in indexes):
            return Unsat("pypi-index-mismatch", f"'{req.name}' requires index {', '.join(indexes)} but the lock file has {pkg.index_url}")
    return None


def _requires_python(pkg: lockfile.PypiPackage, markers: dict) -> Unsat | None:
    """platform.rs: the interpreter must lie above every lower bound of requires_python (uv's
    RequiresPython::is_contained_by compares lower bounds)."""
    if not pkg.requires_python:
        return None
    python = Version(markers["python_full_version"])
    try:
        specs = SpecifierSet(pkg.requires_python)
    except Exception:
        return None
    for spec in specs:
        if spec.operator in (">=", ">", "==", "~=", "===") and not spec.contains(python, prereleases=True) \
                and (spec.operator != "==" or not spec.version.endswith(".*")) and Version(spec.version.rstrip(".*")) > python:
            return Unsat("python-version-mismatch", f"the package '{pkg.name}' requires python {pkg.requires_python} "
                                                    f"but the lock file has python {python}")
    return None
