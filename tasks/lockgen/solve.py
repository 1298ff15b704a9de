"""The conda part of an environment: pixi's solver (resolvo, via py-rattler) over the record store."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gptforge.errors import GptforgeError
from gptforge.lock.manifest import Environment
from gptforge.lock.store import SUBDIRS, Store


@dataclass(frozen=True)
class CondaSolution:
    records: tuple            # rattler RepoDataRecords, sorted by name
    seconds: float


def conda_specs(env: Environment) -> list[str]:
    return [f"{name} {_conda_version(spec)}".strip() for name, spec in env.conda.items()]


def _conda_version(spec) -> str:
    if isinstance(spec, str):
        return "" if spec == "*" else spec
    if isinstance(spec, dict) and set(spec) <= {"version"}:
        return _conda_version(spec.get("version", "*"))
    raise GptforgeError(f"pixi.toml: conda spec {spec!r} is not supported by the offline builder",
                        "use a version string, or run `pixi lock` where pixi runs")


def virtual_package(text: str):
    """'__glibc=2.28' or '__unix=0=0' as a rattler GenericVirtualPackage."""
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version

    name, version, *build = text.split("=")
    return GenericVirtualPackage(PackageName(name), Version(version), BuildString(build[0] if build else "0"))


async def _solve(store: Store, env: Environment):
    from rattler import Channel, MatchSpec, SparseRepoData
    from rattler.solver import solve_with_sparse_repodata

    channel = Channel(store.channel)
    repodata = [SparseRepoData(channel, subdir, store.repodata_path(subdir)) for subdir in SUBDIRS]
    try:
        return await solve_with_sparse_repodata(
            specs=[MatchSpec(spec) for spec in conda_specs(env)],
            sparse_repodata=repodata,
            virtual_packages=[virtual_package(v) for v in env.platform.virtual_packages()],
            strategy="highest",
        )
    finally:
        for sparse in repodata:  # an open SparseRepoData crashes the interpreter at exit
            sparse.close()


def solve(store: Store, env: Environment) -> CondaSolution:
    store.check_exists()
    start = time.perf_counter()
    try:
        records = asyncio.run(_solve(store, env))
    except Exception as err:  # rattler raises SolverError and friends, all with the solver's account
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GptforgeError(f"environment {env.name}: no solution from the record store: {first}",
                            "add a public pixi.lock holding the missing records (tasks/import_records.py)")
    return CondaSolution(tuple(sorted(records, key=lambda r: r.name.normalized)), time.perf_counter() - start)
