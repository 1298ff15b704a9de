"""pixi 0.77.0's satisfiability check, ported: does pixi.lock satisfy pixi.toml, environment by
environment and platform by platform? Each rule names the pixi source file it follows (paths under
crates/pixi_core/src/lock_file/ unless said otherwise). Like pixi, a platform stops at its first
problem; unlike pixi, every environment is checked, so one run names them all."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from gptforge.lock import lockfile, workspace as ws
from gptforge.lock.pyplatform import wheel_tags
from gptforge.lock.satisfy_platform import customised, verify_platform
from gptforge.lock.workspace import DEFAULT_INDEX, Unsat, channel_url, vp_parts

# pixi_manifest solve-strategy / channel-priority values -> rattler_lock's names in `options:`
STRATEGY = {None: "highest", "highest": "highest", "lowest": "lowest-version", "lowest-direct": "lowest-version-direct"}


@dataclass(frozen=True)
class Problem:
    environment: str
    code: str
    message: str
    platform: str | None = None

    def line(self) -> str:
        where = f"{self.environment} [{self.platform}]" if self.platform else self.environment
        return f"{where}: {self.message} [{self.code}]"


def expected_indexes(options: dict) -> dict:
    """rattler_lock PypiIndexes from the pypi-options: index-url (default PyPI), extra-index-urls, find-links."""
    out = {"indexes": [options.get("index-url", DEFAULT_INDEX)] + list(options.get("extra-index-urls", []))}
    links = [fl.get("url") or fl.get("path") for fl in options.get("find-links", [])]
    if links:
        out["find-links"] = [{"url": u} if "://" in u else {"path": u} for u in links]
    return out


def _locked_indexes(indexes: dict | None) -> dict | None:
    if indexes is None:
        return None
    out = {"indexes": list(indexes.get("indexes") or [])}
    links = [fl.get("url") or fl.get("path") if isinstance(fl, dict) else fl for fl in indexes.get("find-links") or []]
    if links:
        out["find-links"] = [{"url": u} if "://" in str(u) else {"path": u} for u in links]
    return out


def align_platform_names(lock: lockfile.Lock, workspace: ws.Workspace) -> None:
    """platform_rename.rs align_platform_names: a lock platform (`p1`, as pixi writes them) takes the
    name of the one workspace platform with its subdir and customised virtual packages."""
    manifest_names = {p.name for p in workspace.platforms}
    renames = {}
    for locked in lock.platforms.values():
        same = [p for p in workspace.platforms if p.subdir == locked.subdir and p.customised() == customised(locked)]
        if len(same) == 1 and same[0].name != locked.name and same[0].name not in lock.platforms \
                and locked.name not in manifest_names:
            renames[locked.name] = same[0].name
    for old, new in renames.items():
        lock.platforms[new] = lockfile.LockPlatform(new, *(lambda p: (p.subdir, p.virtual_packages))(lock.platforms.pop(old)))
        for env in lock.environments.values():
            if old in env.packages:
                env.packages[new] = env.packages.pop(old)


def verify_environment(env: ws.Environment, locked: lockfile.LockEnvironment, lock: lockfile.Lock) -> None:
    """satisfiability/environment.rs verify_environment_satisfiability."""
    channels = [channel_url(c) for c in env.channels()]
    locked_channels = [channel_url(c) for c in locked.channels]
    if channels[:len(locked_channels)] == locked_channels:
        if len(channels) > len(locked_channels):
            raise Unsat("channels-extended", "channels were extended with additional lower-priority channels")
    else:
        raise Unsat("channels-mismatch", "the channels in the lock file do not match the environments channels")

    names = {p.name for p in env.platforms}
    subdirs = {p.subdir for p in env.platforms}
    extra = sorted(n for n in locked.packages if n not in names and lock.platforms[n].subdir not in subdirs)
    if extra:
        raise Unsat("additional-platforms", f"platform(s) '{', '.join(extra)}' present in the lock file but not in the environment")
    for name in locked.packages:
        mine = next((p for p in env.platforms if p.name == name), None)
        if mine is None:
            continue
        have = lock.platforms[name]
        if mine.subdir != have.subdir:
            raise Unsat("platform-definition-changed", f"the workspace platform '{name}' uses subdir '{mine.subdir}' "
                                                       f"but the lock-file was solved with subdir '{have.subdir}'")
        if mine.customised() != customised(have):
            raise Unsat("platform-definition-changed", f"the workspace platform '{name}' declares virtual packages "
                                                       f"[{', '.join(mine.customised())}] but the lock-file was solved "
                                                       f"with [{', '.join(customised(have))}]")

    options = env.pypi_options()
    if env.pypi_dependencies():
        want = expected_indexes(options)
        have = _locked_indexes(locked.indexes)
        has_pypi = any(isinstance(p, lockfile.PypiPackage) for pkgs in locked.packages.values() for p in pkgs)
        # rattler_lock FileFormatVersion::should_pypi_indexes_be_present: from format 5 on
        if (have is None and lock.version >= 5 and has_pypi) or (have is not None and have != want):
            raise Unsat("indexes-mismatch", f"the indexes used to previously solve to lock file "
                                            f"({(have or {}).get('indexes')}) do not match the environments indexes ({want['indexes']})")
        no_build = options.get("no-build")
        for name, pkgs in locked.packages.items():
            tags = _platform_wheel_tags(env, lock.platforms[name], pkgs)
            for pkg in pkgs:
                if not isinstance(pkg, lockfile.PypiPackage):
                    continue
                _no_build(pkg, no_build, env.pypi_dependencies(), env)
                if tags is not None and pkg.file_name.endswith(".whl") and not _wheel_ok(pkg.file_name, tags):
                    raise Unsat("wheel-tags-mismatch", "the lock file was solved with system requirements "
                                                       f"incompatible with the tags on wheel ({pkg.name})")

    want_strategy = STRATEGY.get(env.option("solve-strategy"), env.option("solve-strategy"))
    if locked.options["strategy"] != want_strategy:
        raise Unsat("solve-strategy-mismatch", f"the lock file was solved with a different strategy "
                                               f"({locked.options['strategy']}) than the one selected ({want_strategy})")
    want_priority = env.option("channel-priority") or "strict"
    if locked.options["channel-priority"] != want_priority:
        raise Unsat("channel-priority-mismatch", f"the lock file was solved with a different channel priority "
                                                 f"({locked.options['channel-priority']}) than the one selected ({want_priority})")
    want_mode = options.get("prerelease-mode", "if-necessary-or-explicit")
    if locked.options["pypi-prerelease-mode"] != want_mode:
        raise Unsat("prerelease-mode-mismatch", f"the lock file was solved with a different PyPI prerelease mode "
                                                f"({locked.options['pypi-prerelease-mode']}) than the one selected ({want_mode})")
    # errors.rs verify_exclude_newer: no locked conda package newer than the cutoff
    cutoff = ws.exclude_newer_cutoff(env.option("exclude-newer"))
    if cutoff is not None:
        for pkgs in locked.packages.values():
            for pkg in pkgs:
                stamp = _timestamp(pkg)
                if stamp is not None and stamp > cutoff:
                    raise Unsat("exclude-newer-mismatch", f"the locked package '{pkg.name}' has timestamp {_iso(stamp)}, "
                                                          f"which is newer than the environment's exclude-newer cutoff {_iso(cutoff)}")


def _iso(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _timestamp(pkg) -> datetime.datetime | None:
    if not isinstance(pkg, lockfile.CondaPackage) or pkg.data.get("timestamp") is None:
        return None
    raw = int(pkg.data["timestamp"])
    seconds = raw / 1000 if raw > 253402300799 else raw      # rattler reads milliseconds past year 9999 as ms
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def _no_build(pkg: lockfile.PypiPackage, no_build, pypi_deps: dict, env) -> None:
    """environment.rs PypiNoBuildCheck: with no-build, only wheels (and editable paths) may be locked."""
    if no_build in (None, False):
        return
    if pkg.is_path:
        spec = pypi_deps.get(pkg.name) or next((v for k, v in pypi_deps.items() if k.lower() == pkg.name), None)
        if isinstance(spec, dict) and spec.get("editable"):
            return
    if pkg.file_name.endswith(".whl"):
        return
    if no_build is True or pkg.name in {n.lower() for n in (no_build if isinstance(no_build, list) else [])}:
        raise Unsat("no-build-non-binary", f"the lock file contains non-binary package: '{pkg.name}', "
                                           "but the pypi-option `no-build` is set")


def _platform_wheel_tags(env: ws.Environment, locked: lockfile.LockPlatform, pkgs: list):
    """environment.rs PypiWheelTagsCheck: the tags of the platform's locked python, None without one."""
    python = next((p for p in pkgs if isinstance(p, lockfile.CondaPackage) and p.name == "python"), None)
    if python is None:
        return None
    platform = next((p for p in env.platforms if p.name == locked.name), None) or next(
        (p for p in env.platforms if p.subdir == locked.subdir), None)
    vps = dict(vp_parts(v)[:2] for v in (platform.declared if platform else ws.subdir_defaults(locked.subdir)))
    return wheel_tags(locked.subdir, str(python.data["version"]), vps.get("__glibc", "2.28"), vps.get("__osx", "13.0"))


def _wheel_ok(file_name: str, tags) -> bool:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        return bool(set(parse_wheel_filename(file_name)[3]) & tags)
    except InvalidWheelFilename:
        return True


def check(manifest_path: Path, lock_path: Path | None = None) -> list[Problem]:
    """satisfiability/tests.rs verify_lock_file_satisfiability, environment by environment."""
    workspace = ws.read(Path(manifest_path))
    lock = lockfile.read(Path(lock_path or workspace.root / "pixi.lock"))
    align_platform_names(lock, workspace)
    out = [Problem(name, "environment-removed", f"environment '{name}' is in the lock-file but no longer exists in the project")
           for name in lock.environments if name not in workspace.environments]
    verified = {}
    for env in workspace.environments.values():
        locked = lock.environments.get(env.name)
        if locked is None:
            out.append(Problem(env.name, "environment-missing", f"environment '{env.name}' is missing"))
            continue
        try:
            verify_environment(env, locked, lock)
        except Unsat as err:
            out.append(Problem(env.name, err.code, err.message))
            continue
        for platform in env.platforms:
            try:
                verified[env.name, platform.name] = verify_platform(workspace, env, platform, locked, lock)
            except Unsat as err:
                out.append(Problem(env.name, err.code, err.message, platform.name))
    # platform.rs verify_solve_group_satisfiability: a conda package that only PyPI requirements reach
    # should have been a PyPI package, judged over the whole solve group
    groups = {}
    for (env_name, platform_name), result in verified.items():
        group = workspace.environments[env_name].solve_group or f"\0{env_name}"
        expected, used = groups.setdefault((group, platform_name), (set(), {}))
        expected |= result[0]
        used.update(dict.fromkeys(result[1], env_name))
    for (group, platform_name), (expected, used) in groups.items():
        for name, env_name in used.items():
            if name not in expected:
                out.append(Problem(env_name, "conda-package-should-be-pypi",
                                   f"'{name}' is locked as a conda package but only requested by pypi dependencies",
                                   platform_name))
                break
    return out
