"""The PyPI part of an environment: uv resolves versions; the registry gives each file's URL, sha256
(PEP 691 simple API) and metadata (PEP 658 `.metadata`, else the file's own PKG-INFO/METADATA)."""

from __future__ import annotations

import email.parser
import hashlib
import io
import subprocess
import tarfile
import tempfile
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from gptforge.errors import GptforgeError
from gptforge.lock.pypi import format_requirement, registry_get, simple_files

@dataclass(frozen=True)
class PypiPackage:
    name: str
    version: str
    location: str                       # URL of the locked file, or "./" for the project itself
    sha256: str | None
    requires_dist: tuple[str, ...]
    requires_python: str | None
    index: str | None = None            # the per-package index the manifest pins it to

    def to_lock(self) -> dict:
        entry = {"pypi": self.location, "name": self.name, "version": self.version}
        if self.index:                  # rattler_lock reads a missing `index:` as the environment's first index
            entry["index"] = self.index
        if self.sha256:
            entry["sha256"] = self.sha256
        if self.requires_dist:
            entry["requires_dist"] = list(self.requires_dist)
        if self.requires_python:
            entry["requires_python"] = self.requires_python
        return entry


def python_tags(python: str, glibc: str = "2.28") -> list[Tag]:
    """Wheel tags of CPython `python` (3.12) on x86_64 Linux with this glibc, best first."""
    major, minor = (int(x) for x in python.split(".")[:2])
    top = int(glibc.split(".")[1])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(top, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return [*cpython_tags((major, minor), platforms=platforms), *compatible_tags((major, minor), platforms=platforms)]


def environment_markers(python_full: str) -> dict[str, str]:
    return {"python_version": ".".join(python_full.split(".")[:2]), "python_full_version": python_full,
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "extra": ""}


def applies(requirement: str, markers: dict[str, str], extras: set[str] = frozenset()) -> bool:
    req = Requirement(requirement)
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**markers, "extra": e}) for e in (extras or {""}))


def closure(roots: list[str], markers: dict[str, str],
            requires_of: Callable[[str], tuple[str, ...] | None]) -> Iterator[tuple[str, str | None]]:
    """pixi's walk: the roots, then the requires_dist of each package reached (requires_of, by
    canonical name; None where PyPI does not give it), markers evaluated with the extras that package
    was asked for. Yields (requirement, the package requiring it or None for a root), each once."""
    todo, seen = [(r, None, frozenset()) for r in reversed(roots)], set()
    while todo:
        text, parent, extras = todo.pop()
        if text in seen or not applies(text, markers, extras):
            continue
        seen.add(text)
        yield text, parent
        req = Requirement(text)
        requires = requires_of(canonicalize_name(req.name))
        todo += [(r, req.name, frozenset(req.extras)) for r in reversed(requires or ())]


def unsatisfied(text: str, versions: dict[str, str]) -> str | None:
    """Why `versions` (canonical name -> locked version) does not satisfy a requirement, or None."""
    req = Requirement(text)
    have = versions.get(canonicalize_name(req.name))
    if have is None:
        return "not locked"
    return None if req.specifier.contains(have, prereleases=True) else f"locked {have}"


# --- the registry ------------------------------------------------------------------------------


def pick_file(files: list[dict], version: str, tags: list[Tag]) -> dict:
    """The file pixi would install: the best-tagged wheel of `version`, else its sdist."""
    rank = {tag: i for i, tag in enumerate(tags)}
    best, best_rank = None, len(rank)
    for f in files:
        if f.get("yanked") or not f["filename"].endswith(".whl"):
            continue
        try:
            _, wheel_version, _, wheel_tags = parse_wheel_filename(f["filename"])
        except InvalidWheelFilename:
            continue
        if str(wheel_version) != version:
            continue
        r = min((rank.get(t, len(rank)) for t in wheel_tags), default=len(rank))
        if r < best_rank:
            best, best_rank = f, r
    if best:
        return best
    for f in files:
        if f["filename"].endswith((".tar.gz", ".zip")) and f"-{version}." in f["filename"]:
            return f
    raise GptforgeError(f"no file of version {version} fits this platform", "check the resolution")


def parse_metadata(text: str) -> tuple[tuple[str, ...], str | None]:
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return tuple(format_requirement(r) for r in msg.get_all("Requires-Dist") or ()), msg.get("Requires-Python")


def file_metadata(f: dict) -> tuple[tuple[str, ...], str | None]:
    if f.get("core-metadata") or f.get("data-dist-info-metadata"):
        return parse_metadata(registry_get(f["url"] + ".metadata").decode())
    return archive_metadata(f["filename"], registry_get(f["url"]))


def archive_metadata(filename: str, data: bytes) -> tuple[tuple[str, ...], str | None]:
    """requires_dist / requires_python out of a wheel's METADATA or an sdist's PKG-INFO."""
    if filename.endswith(".whl"):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            return parse_metadata(zf.read(name).decode())
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        member = min((m for m in tf.getmembers() if m.name.endswith("/PKG-INFO")), key=lambda m: m.name.count("/"))
        return parse_metadata(tf.extractfile(member).read().decode())


# --- resolving -------------------------------------------------------------------------------


def uv_compile(requirements: list[str], constraints: list[str], python_full: str,
               preferences: Sequence[str] = ()) -> dict[str, str]:
    """name -> pinned version (or `name @ url` target) as uv resolves them for manylinux_2_28 x86_64. PREFERENCES
    (`name==version`, e.g. the lock's) are kept wherever the requirements allow: uv reads them from its output file."""
    with tempfile.TemporaryDirectory() as tmp:
        req_file, con_file, out_file = Path(tmp, "requirements.in"), Path(tmp, "constraints.txt"), Path(tmp, "out.txt")
        req_file.write_text("\n".join(requirements) + "\n")
        con_file.write_text("\n".join(constraints) + "\n")
        out_file.write_text("".join(f"{pin}\n" for pin in preferences))
        cmd = [_uv(), "pip", "compile", str(req_file), "-c", str(con_file), "-o", str(out_file), "--python-version",
               python_full, "--python-platform", "x86_64-manylinux_2_28", "--no-header", "--no-annotate", "--quiet"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        resolved = out_file.read_text() if done.returncode == 0 else ""
    if done.returncode:
        raise GptforgeError(f"uv could not resolve the PyPI part: {done.stderr.strip().splitlines()[-1:]}",
                            "fix the pypi-dependencies pins")
    pins = {}
    for line in resolved.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req.url or str(req.specifier).removeprefix("==")
    return pins


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        raise GptforgeError("uv is not installed", "pip install uv (resolving the PyPI part needs it)") from None
    return find_uv_bin()


def local_wheel(path: Path, index: str) -> PypiPackage:
    """A wheel of an index that cannot be reached from here: its own bytes give sha256 and metadata;
    its URL is the index's URL and the file name, as that index serves its files."""
    data = path.read_bytes()
    name, version, _, _ = parse_wheel_filename(path.name)
    requires, python = archive_metadata(path.name, data)
    url = f"{index.rstrip('/')}/{urllib.parse.quote(path.name)}"
    return PypiPackage(str(name), str(version), url, hashlib.sha256(data).hexdigest(), requires, python)


def registry_package(index: str, name: str, version: str, tags: list[Tag]) -> PypiPackage:
    f = pick_file(simple_files(index, name), version, tags)
    requires, python = file_metadata(f)
    return PypiPackage(name, version, f["url"], f["hashes"]["sha256"], requires, python)
