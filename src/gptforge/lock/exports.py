"""envs/<env>/: the same solution for conda-lock and pip users.

    conda-lock.yml        conda-lock's unified lock (v1): conda and pip entries with their hashes
    requirements.txt      the PyPI part, hash-pinned (pip install --require-hashes -r ...)
    environment.yml       the manifest's specs, for `conda-lock lock` where a channel is reachable
    virtual-packages.yml  the platform's virtual packages, for the same
"""

from __future__ import annotations

import hashlib

import yaml

from gptforge.lock.manifest import Environment, Manifest

HEADER = "# Generated from pixi.lock by `pixi run lock`; do not edit.\n"


def _yaml(doc, **options) -> str:
    """yaml.safe_dump through libyaml's emitter where PyYAML has it: the pure-Python one was most of `lock check`'s
    time. Both write the same text for these documents (tests/test_lock.py holds them to it)."""
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), **options)


def env_packages(lock: dict, env_name: str) -> tuple[list[dict], list[dict]]:
    """The environment's locked conda and PyPI entries, in lock order."""
    by_key = {p.get("conda") or p.get("pypi"): p for p in lock["packages"]}
    refs = [e for pkgs in lock["environments"][env_name]["packages"].values() for e in pkgs]
    conda = [by_key[r["conda"]] for r in refs if "conda" in r]
    pypi = [by_key[r["pypi"]] for r in refs if "pypi" in r]
    return conda, pypi


def conda_name_version(entry: dict) -> tuple[str, str, str]:
    """name, version, build out of a conda URL (file name: name-version-build.ext)."""
    stem = entry["conda"].rsplit("/", 1)[1].removesuffix(".conda").removesuffix(".tar.bz2")
    name, version, build = stem.rsplit("-", 2)
    return name, version, build


def _deps(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, _, rest = spec.partition(" ")
        out[name] = rest.strip() or "*"
    return out


def _pip_deps(requires: list[str]) -> dict[str, str]:
    from packaging.requirements import Requirement

    out = {}
    for text in requires:
        req = Requirement(text)
        if req.marker is None or "extra" not in str(req.marker):
            out[req.name] = str(req.specifier) or "*"
    return out


def conda_lock(manifest: Manifest, env: Environment, lock: dict) -> str:
    conda, pypi = env_packages(lock, env.name)
    subdir = env.platform.subdir
    section = _yaml(lock["environments"][env.name], sort_keys=True).encode()
    packages = []
    for entry in conda:
        name, version, _ = conda_name_version(entry)
        packages.append({"name": name, "version": version, "manager": "conda", "platform": subdir,
                         "dependencies": _deps(entry.get("depends", [])), "url": entry["conda"],
                         "hash": {"md5": entry["md5"], "sha256": entry["sha256"]},
                         "category": "main", "optional": False})
    for entry in pypi:
        if not entry.get("sha256"):
            continue  # the editable project: `pip install -e .` after `conda-lock install`
        packages.append({"name": entry["name"], "version": str(entry["version"]), "manager": "pip",
                         "platform": subdir, "dependencies": _pip_deps(entry.get("requires_dist", [])),
                         "url": entry["pypi"], "hash": {"sha256": entry["sha256"]},
                         "category": "main", "optional": False})
    doc = {"version": 1, "metadata": {
        "content_hash": {subdir: hashlib.sha256(section).hexdigest()},
        "channels": [{"url": c.split("/")[-2], "used_env_vars": []} for c in manifest.channels],
        "platforms": [subdir], "sources": ["pixi.lock"]}, "package": packages}
    return HEADER + _yaml(doc, sort_keys=False, width=1000)


def requirements(manifest: Manifest, env: Environment, lock: dict) -> str:
    """name==version with its locked sha256; a per-package index (pixi's `index = ...`) is an extra index."""
    _, pypi = env_packages(lock, env.name)
    extra = sorted({s.index for s in env.pypi.values() if s.index})
    lines = [HEADER.rstrip(), *(f"--extra-index-url {url}" for url in extra)]
    for entry in pypi:
        if entry.get("sha256"):  # the editable project has none: `pip install -e . --no-deps`
            lines.append(f"{entry['name']}=={entry['version']} \\\n    --hash=sha256:{entry['sha256']}")
    return "\n".join(lines) + "\n"


def environment_yml(manifest: Manifest, env: Environment) -> str:
    pip = [s.requirement for s in env.pypi.values() if not s.path and not s.index]
    deps: list = [f"{n} {v}".strip() for n, v in ((n, env.conda[n]) for n in env.conda)]
    deps = [d.replace(" *", "") for d in deps] + (["pip", {"pip": pip}] if pip else [])
    doc = {"name": f"gptforge-{env.name}", "channels": [c.split("/")[-2] for c in manifest.channels],
           "platforms": [env.platform.subdir], "dependencies": deps}
    return HEADER + _yaml(doc, sort_keys=False)


def virtual_packages_yml(env: Environment) -> str:
    packages = {}
    for vp in env.platform.virtual_packages():
        name, version, *build = vp.split("=")
        packages[name] = f"{version} {build[0]}" if build else version
    return HEADER + _yaml({"subdirs": {env.platform.subdir: {"packages": packages}}}, sort_keys=False)


def render_all(manifest: Manifest, lock: dict) -> dict[str, str]:
    """Relative path -> text of every export (one directory per exported environment)."""
    out = {}
    for env in manifest.exported():
        base = f"envs/{env.name}"
        out[f"{base}/conda-lock.yml"] = conda_lock(manifest, env, lock)
        out[f"{base}/requirements.txt"] = requirements(manifest, env, lock)
        out[f"{base}/environment.yml"] = environment_yml(manifest, env)
        out[f"{base}/virtual-packages.yml"] = virtual_packages_yml(env)
    return out
