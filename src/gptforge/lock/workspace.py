"""A pixi.toml as pixi 0.77 reads it for satisfiability: platforms (with their virtual packages),
features, and the environments they compose. Only what the satisfiability rules read is kept; a
manifest using what this reader does not model (target tables, source or git conda specs) is
reported as `Unsupported`, never silently misread."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.lock.files import read_toml

DEFAULT_INDEX = "https://pypi.org/simple"

# crates/pixi_default_versions/src/lib.rs and pixi_manifest/src/platform.rs
# (subdir_default_virtual_packages): what every platform of a subdir declares unless it says otherwise.
_ARCHSPEC = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "osx-arm64": "m1", "osx-64": "x86_64",
             "win-64": "x86_64", "linux-ppc64le": "ppc64le", "win-arm64": "aarch64"}
# pixi_manifest/src/toml/platform.rs (FRIENDLY_VIRTUAL_PACKAGES, take_cuda_entry)
FRIENDLY = {"cuda": "__cuda", "archspec": "__archspec", "glibc": "__glibc", "linux": "__linux",
            "macos": "__osx", "osx": "__osx", "windows": "__win"}
# pixi_manifest/src/system_requirements.rs: [system-requirements] keys as virtual packages
SYSREQ = {"libc": "__glibc", "cuda": "__cuda", "linux": "__linux", "macos": "__osx"}


class Unsat(Exception):
    """A satisfiability rule failed: `code` is stable, `message` is what pixi would say."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Unsupported(GptforgeError):
    """The manifest or lock uses what the offline check cannot see (a source build, a git checkout)."""


def subdir_defaults(subdir: str) -> list[str]:
    out = []
    if not subdir.startswith("win"):
        out.append("__unix=0=0")
    if subdir.startswith("linux"):
        out += ["__linux=4.18", "__glibc=2.28"]
    if subdir.startswith("win"):
        out.append("__win=10.0")
    if subdir.startswith("osx"):
        out.append("__osx=13.0")
    if subdir in _ARCHSPEC:
        out.append(f"__archspec=0={_ARCHSPEC[subdir]}")
    return out


def channel_url(channel) -> str:
    """rattler NamedChannelOrUrl::into_base_url: a name is a conda.anaconda.org channel."""
    channel = channel.get("channel") if isinstance(channel, dict) else str(channel)
    if "://" in channel:
        return channel.rstrip("/") + "/"
    return f"https://conda.anaconda.org/{channel.strip('/')}/"


def vp_parts(text: str) -> tuple[str, str, str]:
    """`__cuda=12.0` -> (name, version, build) as parse_locked_virtual_package splits it."""
    name, _, rest = text.partition("=")
    version, _, build = rest.partition("=")
    return name, version, build


@dataclass(frozen=True)
class PixiPlatform:
    name: str
    subdir: str
    declared: tuple[str, ...]     # virtual packages, `name=version[=build]`, subdir defaults merged in

    def customised(self) -> list[str]:
        """platform.rs customised_virtual_packages: the declared ones that are not subdir defaults."""
        defaults = set(subdir_defaults(self.subdir))
        return sorted(v for v in self.declared if v not in defaults and f"{v}=0" not in defaults)


def _platform_with_defaults(name: str, subdir: str, declared: list[str]) -> PixiPlatform:
    """platform.rs merge_subdir_defaults: a declared libc replaces the default __glibc."""
    names = {vp_parts(v)[0] for v in declared}
    for default in subdir_defaults(subdir):
        dname = vp_parts(default)[0]
        if dname in names or (dname == "__glibc" and names & {"__glibc", "__musl", "__eglibc"}):
            continue
        declared.append(default)
    return PixiPlatform(name, subdir, tuple(declared))


def _synth_name(subdir: str, declared: list[str]) -> str:
    """toml/platform.rs synthesize_name_string (friendly keys first, sanitized)."""
    parts = [subdir]
    reverse = {v: k for k, v in FRIENDLY.items() if k != "osx"}
    for vp in declared:
        name, version, build = vp_parts(vp)
        if vp in subdir_defaults(subdir):
            continue
        key = reverse.get(name, name.lstrip("_"))
        value = build if name == "__archspec" else version
        parts.append(f"{key}-{re.sub(r'[^A-Za-z0-9]+', '-', value).strip('-')}")
    return "-".join(parts)


def _platform(entry) -> PixiPlatform:
    """toml/platform.rs TomlPixiPlatform: a bare subdir, or a table with name/platform and VPs."""
    if isinstance(entry, str):
        return PixiPlatform(entry, entry, tuple(subdir_defaults(entry)))
    entry = dict(entry)
    name, subdir = entry.pop("name", None), entry.pop("platform", None)
    subdir = subdir or name
    declared = []
    cuda = entry.pop("cuda", None)
    if isinstance(cuda, dict):
        declared.append(f"__cuda={cuda['driver']}")
        if "arch" in cuda:
            declared.append(f"__cuda_arch={cuda['arch']}")
    elif cuda is not None:
        declared.append(f"__cuda={cuda}")
    for key, value in entry.items():
        if key == "archspec":
            declared.append(f"__archspec=0={value}")
        elif key in FRIENDLY:
            declared.append(f"{FRIENDLY[key]}={value}")
        elif key.startswith("__"):
            declared.append(f"{key}={value}")
        else:
            raise GptforgeError(f"pixi.toml: platform key '{key}' is not one pixi 0.77 reads",
                                "use name, platform, cuda, archspec, glibc, linux, macos or windows")
    if name is None:
        name = _synth_name(subdir, declared)
    if name == subdir:
        return PixiPlatform(name, subdir, tuple(subdir_defaults(subdir)))
    return _platform_with_defaults(name, subdir, declared)


@dataclass
class Feature:
    name: str
    table: dict
    platforms: list[str] | None = None

    def get(self, key, default=None):
        return self.table.get(key, default)


@dataclass
class Environment:
    name: str
    features: list[Feature]
    solve_group: str | None
    platforms: list[PixiPlatform] = field(default_factory=list)

    def _merged(self, key: str) -> dict:
        out = {}
        for feature in self.features:
            out.update(feature.get(key) or {})
        return out

    def dependencies(self) -> dict:
        return self._merged("dependencies")

    def constraints(self) -> dict:
        return self._merged("constraints")

    def pypi_dependencies(self) -> dict:
        return self._merged("pypi-dependencies")

    def pypi_options(self) -> dict:
        """Feature pypi-options merged; index-url from the first feature that sets one (pixi's union)."""
        out: dict = {}
        for feature in reversed(self.features):      # named features take priority over the default
            for key, value in (feature.get("pypi-options") or {}).items():
                if isinstance(value, list):
                    out[key] = out.get(key, []) + [v for v in value if v not in out.get(key, [])]
                elif isinstance(value, dict):
                    out[key] = {**value, **out.get(key, {})}
                else:
                    out.setdefault(key, value)
        return out

    def option(self, key: str):
        """solve-strategy, channel-priority, exclude-newer: the last feature that sets it wins."""
        return next((f.get(key) for f in reversed(self.features) if f.get(key) is not None), None)

    def channels(self) -> list[str]:
        out = []
        for feature in self.features[1:] + self.features[:1]:
            out += [c for c in feature.get("channels") or () if c not in out]
        return out


@dataclass
class Workspace:
    root: Path
    platforms: list[PixiPlatform]
    environments: dict[str, Environment]

    def platform(self, name: str) -> PixiPlatform | None:
        return next((p for p in self.platforms if p.name == name), None)


_UNSUPPORTED_TABLES = ("target", "package", "dev")


def _feature(name: str, table: dict) -> Feature:
    for key in _UNSUPPORTED_TABLES:
        if key in table:
            raise Unsupported(f"pixi.toml: [{key}] tables are not read by the offline check",
                              "check this workspace with pixi itself")
    for spec in (table.get("dependencies") or {}).values():
        if isinstance(spec, dict) and {"path", "git", "url"} & set(spec):
            raise Unsupported("pixi.toml: a source conda dependency needs a source build to check",
                              "check this workspace with pixi itself")
    return Feature(name, table, table.get("platforms"))


def read(path: Path) -> Workspace:
    """Read pixi.toml (a pyproject.toml manifest is not read) into the workspace model."""
    doc = read_toml(Path(path), "pixi.toml")
    if not isinstance(doc, dict):
        raise GptforgeError(f"{path}: not a TOML table", "pass --manifest PATH to a pixi.toml")
    workspace = doc.get("workspace") or doc.get("project")
    if not isinstance(workspace, dict):
        raise GptforgeError(f"{path}: no [workspace] table", "pass --manifest PATH to a pixi.toml")
    if workspace.get("preview"):
        raise Unsupported(f"{path}: preview features ({', '.join(workspace['preview'])}) need source builds",
                          "check this workspace with pixi itself")
    default = {k: v for k, v in doc.items() if k not in ("workspace", "project", "feature", "environments")}
    default["channels"] = workspace.get("channels", [])
    for key in ("channel-priority", "solve-strategy", "exclude-newer"):
        if key in workspace:
            default[key] = workspace[key]
    if "pypi-options" in workspace:
        default["pypi-options"] = {**workspace["pypi-options"], **default.get("pypi-options", {})}
    features = {"default": _feature("default", default)}
    for name, table in (doc.get("feature") or {}).items():
        features[name] = _feature(name, table)
    platforms = [_platform(p) for p in workspace.get("platforms", [])]
    _migrate_system_requirements(platforms, features)

    envs = {}
    declared = doc.get("environments") or {}
    if "default" not in declared:
        declared = {"default": [], **declared}
    for env_name, entry in declared.items():
        entry = {"features": entry} if isinstance(entry, list) else entry
        try:
            names = ([] if entry.get("no-default-feature") else ["default"]) + list(entry.get("features", []))
            env_features = [features[n] for n in names]
        except KeyError as err:
            raise GptforgeError(f"pixi.toml: environment {env_name} names an unknown feature {err}",
                                "declare the feature or drop it from the environment") from None
        env = Environment(env_name, env_features, entry.get("solve-group"))
        env.platforms = _environment_platforms(env, platforms)
        envs[env_name] = env
    return Workspace(Path(path).parent, platforms, envs)


def _migrate_system_requirements(platforms: list[PixiPlatform], features: dict[str, Feature]) -> None:
    """toml/manifest.rs migrate_system_requirements_to_platforms: with only bare-subdir platforms, a
    feature's [system-requirements] becomes a platform per subdir declaring them."""
    sysreqs = {n: f.get("system-requirements") for n, f in features.items() if f.get("system-requirements")}
    if not sysreqs:
        return
    if not all(p.name == p.subdir for p in platforms):
        raise GptforgeError("pixi.toml: [system-requirements] beside platforms with virtual packages",
                            "declare the requirements on the platforms instead")
    originals = list(platforms)
    platforms.clear()
    for name, feature in features.items():
        if name not in sysreqs:
            platforms += [p for p in originals if p.name in (feature.platforms or ()) and p not in platforms]
            continue
        subdirs = feature.platforms or [p.subdir for p in originals]
        names = []
        for subdir in subdirs:
            declared = [f"{SYSREQ[k]}={v}" for k, v in sysreqs[name].items() if k in SYSREQ]
            declared = [v for v in declared if v not in subdir_defaults(subdir)]
            synth = _synth_name(subdir, declared)
            plat = PixiPlatform(subdir, subdir, tuple(subdir_defaults(subdir))) if synth == subdir \
                else _platform_with_defaults(synth, subdir, declared)
            if plat not in platforms:
                platforms.append(plat)
            names.append(plat.name)
        feature.platforms = names
    covered = {p.subdir for p in platforms}
    platforms += [p for p in originals if p.subdir not in covered]


def _environment_platforms(env: Environment, platforms: list[PixiPlatform]) -> list[PixiPlatform]:
    """The intersection of the features' platforms (workspace platforms when none names any); with
    bare-subdir workspaces pixi composes by subdir, the most specific platform winning."""
    by_name = {p.name: p for p in platforms}
    chosen: list[PixiPlatform] | None = None
    for feature in env.features:
        if feature.platforms is None:
            continue
        mine = [by_name[n] if n in by_name else _platform(n) for n in feature.platforms]
        if chosen is None:
            chosen = mine
        else:
            subdirs = {p.subdir for p in mine}
            names = {p.name for p in mine}
            kept = [p for p in chosen if p.name in names]
            kept += [max((p, q), key=lambda x: len(x.customised()))
                     for p in chosen if p.name not in names and p.subdir in subdirs
                     for q in mine if q.subdir == p.subdir and q.name != p.name]
            chosen = kept
    return chosen if chosen is not None else list(platforms)


def exclude_newer_cutoff(value) -> datetime.datetime | None:
    """A date means the end of that day (its next midnight, UTC), a timestamp itself."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)
    if isinstance(value, datetime.date):
        return datetime.datetime.combine(value + datetime.timedelta(days=1), datetime.time(),
                                         datetime.timezone.utc)
    text = str(value)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return exclude_newer_cutoff(datetime.date.fromisoformat(text))
    return exclude_newer_cutoff(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")))
