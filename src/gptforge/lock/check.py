"""`gptforge lock check`: pixi.lock and envs/ against pixi.toml, by pixi's satisfiability rules, the
record store, and the compatibility engine. Each problem is one line with a stable code."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gptforge.core.versions import cuda_release
from gptforge.errors import FileReadError
from gptforge.lock import exports, lockfile, satisfy
from gptforge.lock.manifest import Environment, Manifest, pyproject
from gptforge.lock.satisfy import Problem
from gptforge.lock.store import Store
from gptforge.reading import read_bytes

CUDA_LIBS = {"cudnn": ("cudnn", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"),
             "nccl": ("nccl", "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
             "nvcc": ("cuda-nvcc-tools", "nvidia-cuda-nvcc")}


def store_problems(manifest: Manifest, lock, store: Store) -> list[Problem]:
    """Every conda record is one of the recorded public records (envs/records/), sha256 and all."""
    store.check_readable()
    stored = store.records()
    out = []
    for env_name, env in lock.environments.items():
        for platform, packages in env.packages.items():
            for pkg in packages:
                if not isinstance(pkg, lockfile.CondaPackage):
                    continue
                known = stored.get(pkg.url)
                if known is None or known.sha256 != pkg.data.get("sha256"):
                    out.append(Problem(env_name, "unrecorded", f"{pkg.url} is not a recorded public record"
                                                               + (" (sha256 differs)" if known else ""), platform))
    return out


def extra_problems(manifest: Manifest, env: Environment) -> list[Problem]:
    """Every extra the manifest asks of the project is declared in its pyproject.toml (uv refuses the solve)."""
    spec = next((s for s in env.pypi.values() if s.path), None)
    if spec is None:
        return []
    declared = {canonicalize_name(e) for e in pyproject(manifest, spec).get("optional-dependencies", {})}
    return [Problem(env.name, "unknown-extra", f"pixi.toml asks for {spec.name}[{e}], which pyproject.toml does not declare")
            for e in spec.extras if canonicalize_name(e) not in declared]


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


def _holds(path: Path, data: bytes) -> bool:
    """PATH is a regular file of exactly DATA (read no further than one byte past it: a huge file is not loaded)."""
    try:
        return read_bytes(path, max_bytes=len(data)) == data
    except FileReadError:
        return False


def export_problems(manifest: Manifest, lock: dict, root: Path) -> list[Problem]:
    out = []
    for rel, text in exports.render_all(manifest, lock).items():
        if not _holds(root / rel, text.encode()):
            out.append(Problem(rel.split("/")[1], "export-stale", f"{rel} differs from pixi.lock (run: pixi run lock)"))
    exported = {e.name for e in manifest.exported()}
    for extra in sorted(p for p in (root / "envs").glob("*/conda-lock.yml") if p.parent.name not in exported):
        out.append(Problem(extra.parent.name, "export-extra", f"envs/{extra.parent.name}/ is not the export of any "
                                                              "environment (delete it; the lock builder deletes nothing)"))
    return out


def check(manifest: Manifest, store: Store, root: Path | None = None) -> list[Problem]:
    """pixi's satisfiability (lock/satisfy.py), then what this project asks beyond it: lock format 7,
    recorded conda records, declared extras, compatible CUDA pieces, and exports equal to the lock."""
    root = Path(root or manifest.root)
    lock_path = root / "pixi.lock"
    doc = lockfile.read_document(lock_path)
    lock = lockfile.read(lock_path)
    out = []
    if lock.version != 7:
        out.append(Problem("-", "lock-version", f"pixi.lock is version {lock.version}, pixi 0.77 writes 7"))
    out += satisfy.check(manifest.path, lock_path)
    out += store_problems(manifest, lock, store)
    for env in manifest.environments.values():
        out += extra_problems(manifest, env)
        if env.name in lock.environments:
            out += compat_problems(env, doc)
    if any(env not in lock.environments for env in manifest.environments):
        return out              # the exports cannot be rendered from a lock that lacks an environment
    return out + export_problems(manifest, doc, root)
