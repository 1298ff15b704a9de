"""What pixi.toml asks for, resolved per environment as pixi does (default feature + named features)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.lock.workspace import DEFAULT_INDEX, channel_url, subdir_defaults


@dataclass(frozen=True)
class Platform:
    name: str                 # as written in the lock: linux-64, or the rich platform's name
    subdir: str
    cuda: str | None = None

    def virtual_packages(self) -> list[str]:
        """pixi's virtual packages for this platform: __cuda first, then the subdir's defaults."""
        cuda = [f"__cuda={self.cuda}"] if self.cuda else []
        return cuda + subdir_defaults(self.subdir)


@dataclass(frozen=True)
class PypiSpec:
    name: str
    version: str = ""             # PEP 440 specifier, "" for any
    index: str | None = None      # a per-package index (pixi's `index = ...`)
    path: str | None = None       # a local source (the project itself)
    editable: bool = False
    extras: tuple[str, ...] = ()  # pixi's `extras = [...]`: optional-dependencies groups asked for

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}{self.version}"


@dataclass(frozen=True)
class Environment:
    name: str
    platform: Platform
    conda: dict[str, str]              # name -> match spec version part, as in the manifest
    pypi: dict[str, PypiSpec]
    solve_group: str | None = None
    features: tuple[str, ...] = ()
    no_default_feature: bool = False

    @property
    def composition(self) -> tuple:
        """What makes the environment: two environments with the same composition solve the same."""
        return self.features, self.no_default_feature, self.solve_group


@dataclass(frozen=True)
class Manifest:
    path: Path
    channels: tuple[str, ...]
    platforms: dict[str, Platform]
    environments: dict[str, Environment]
    indexes: tuple[str, ...] = (DEFAULT_INDEX,)

    @property
    def root(self) -> Path:
        return self.path.parent

    def exported(self) -> list[Environment]:
        """The environments that get envs/<name>/: one per composition (features, solve-group), so a
        `default` that repeats a named environment is left out (pixi.lock keeps it, as pixi does)."""
        first = {}
        for env in sorted(self.environments.values(), key=lambda e: e.name == "default"):
            first.setdefault(env.composition, env.name)
        return [e for e in self.environments.values() if first[e.composition] == e.name]


def _pypi_spec(name: str, spec) -> PypiSpec:
    if isinstance(spec, str):
        return PypiSpec(name, "" if spec == "*" else spec)
    return PypiSpec(name, spec.get("version", ""), spec.get("index"), spec.get("path"), bool(spec.get("editable")),
                    tuple(spec.get("extras", ())))


def _platforms(entries: list) -> dict[str, Platform]:
    platforms = {}
    for entry in entries:
        if isinstance(entry, str):
            platforms[entry] = Platform(entry, entry)
        else:
            platforms[entry["name"]] = Platform(entry["name"], entry["platform"], entry.get("cuda"))
    return platforms


def load(path: Path) -> Manifest:
    """Read pixi.toml; a manifest the offline builder cannot represent is a one-line error."""
    from gptforge.lock.files import read_toml

    doc = read_toml(Path(path), "pixi.toml")
    try:
        return _manifest(Path(path), doc)
    except (AttributeError, TypeError, KeyError, ValueError) as err:  # a table where a value belongs, or the reverse
        raise GptforgeError(f"{path}: a value of the wrong kind ({type(err).__name__}: {str(err)[:120]})",
                            "write it as pixi's manifest reference does, or restore pixi.toml from git") from None


def _manifest(path: Path, doc: dict) -> Manifest:
    workspace = doc.get("workspace") or doc.get("project") or {}
    platforms = _platforms(workspace.get("platforms", []))
    features = doc.get("feature", {})
    envs = {}
    for env_name, entry in doc.get("environments", {}).items():
        entry = {"features": entry} if isinstance(entry, list) else entry
        unknown = next((f for f in entry.get("features", ()) if f not in features), None)
        if unknown is not None:  # the words of workspace.load, which pixi's rules read
            raise GptforgeError(f"pixi.toml: environment {env_name} names an unknown feature {unknown!r}",
                                "declare the feature or drop it from the environment")
        parts = ([] if entry.get("no-default-feature") else [doc]) + [features[f] for f in entry.get("features", [])]
        env_platforms = [p for part in parts for p in part.get("platforms", [])] or list(platforms)
        if len(env_platforms) != 1:
            raise GptforgeError(f"pixi.toml: environment {env_name} has {len(env_platforms)} platforms",
                                "the offline builder locks one platform per environment")
        conda = {k: v for part in parts for k, v in part.get("dependencies", {}).items()}
        pypi = {k: _pypi_spec(k, v) for part in parts for k, v in part.get("pypi-dependencies", {}).items()}
        envs[env_name] = Environment(env_name, platforms[env_platforms[0]], conda, pypi, entry.get("solve-group"),
                                     tuple(entry.get("features", [])), bool(entry.get("no-default-feature")))
    options = doc.get("pypi-options", {})
    indexes = tuple([options.get("index-url", DEFAULT_INDEX)] + options.get("extra-index-urls", []))
    return Manifest(path, tuple(channel_url(c) for c in workspace.get("channels", [])), platforms, envs, indexes)


def pyproject(manifest: Manifest, spec: PypiSpec) -> dict:
    from gptforge.reading import read_toml

    path = manifest.root / spec.path / "pyproject.toml"
    fix = f"fix the path of {spec.name} in pixi.toml or its pyproject.toml"
    project = read_toml(path, fix=fix).get("project")
    if not isinstance(project, dict):
        raise GptforgeError(f"{path}: no [project] table", fix)
    return project
