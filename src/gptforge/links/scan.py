"""Read-only look at a prefix: what each name is, and which real library files it holds."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from gptforge.links.elf import read_soname
from gptforge.links.families import Family, Version
from gptforge.links.layout import Layout
from gptforge.links.libversion import read_versions

_LIB_NAME = re.compile(r"(lib[A-Za-z0-9_]+)\.so(?:\.\d+(?:\.\d+)*)?$")


@dataclass(frozen=True)
class Entry:
    """What is at a path: 'absent', 'link', 'file', 'dir' or 'other'."""

    kind: str
    target: str | None = None  # the link text, for links
    real: str | None = None  # where it resolves; None when absent, dangling or cyclic

    def to_json(self) -> dict:
        return {"kind": self.kind, "target": self.target} if self.kind == "link" else {"kind": self.kind}


def entry(path: str) -> Entry:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Entry("absent")
    if stat.S_ISLNK(st.st_mode):
        return Entry("link", os.readlink(path), resolve(path))
    kind = "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"
    return Entry(kind, None, os.path.realpath(path))


def resolve(path: str) -> str | None:
    """The real path ``path`` leads to, or None for a dangling or cyclic link."""
    try:
        os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path)


@dataclass(frozen=True)
class Candidate:
    """A real library file a family's links may point at."""

    real: str
    version: Version
    soname: str


@dataclass(frozen=True)
class Ignored:
    path: str
    reason: str


def library_names(layout: Layout, wanted: set[str]) -> dict[str, list[tuple[str, str]]]:
    """stem -> [(dir, name)] for every ``libX.so*`` name of a wanted family in the library dirs."""
    found: dict[str, list[tuple[str, str]]] = {}
    for directory in layout.library_dirs():
        for name in os.listdir(directory):
            m = _LIB_NAME.match(name)
            if m and m.group(1) in wanted:
                found.setdefault(m.group(1), []).append((directory, name))
    return found


@dataclass(frozen=True)
class Unread:
    """A real file whose name holds only its SONAME's major: its version must be read from it."""

    path: str  # as found, relative to the prefix
    real: str
    soname: str


Found = tuple[list[Candidate], list[Ignored], list[Unread]]


def candidates(layout: Layout, family: Family, names: list[tuple[str, str]]) -> Found:
    """Real files of ``family`` inside the prefix whose file name, version and SONAME agree; those
    whose name is too short for the family's rule come back as ``Unread``."""
    seen: set[str] = set()
    good: list[Candidate] = []
    ignored: list[Ignored] = []
    unread: list[Unread] = []
    for directory, name in names:
        path = os.path.join(directory, name)
        if family.version_of(name) is None:
            continue
        real = resolve(path)
        if real is None or real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        problem, cand = _judge(layout, family, real)
        if isinstance(cand, Candidate) and len(cand.version) < family.detail:
            if family.probe is None:
                ignored.append(Ignored(layout.rel(path), f"its name {os.path.basename(real)} does not carry the "
                                       "version and the library has no version function gptforge knows"))
            else:
                unread.append(Unread(layout.rel(path), real, cand.soname))
        elif cand is not None:
            good.append(cand)
        else:
            ignored.append(Ignored(layout.rel(path), problem))
    return good, ignored, unread


def read_unread(items: list[tuple[Family, Unread]]) -> list[Candidate | Ignored]:
    """Ask each file its own version (one fresh process for all); keep those whose major is the SONAME's."""
    readings = read_versions([(u.real, *family.probe) for family, u in items])
    out: list[Candidate | Ignored] = []
    for (family, u), reading in zip(items, readings):
        version = reading.version
        if version is None:
            out.append(Ignored(u.path, f"its version could not be read from the file: {reading.error}"))
        elif version[0] != family.version_of(u.soname)[0]:
            out.append(Ignored(u.path, f"{family.probe[0]} says {'.'.join(map(str, version))}, "
                                       f"not the major of its SONAME {u.soname}"))
        else:
            out.append(Candidate(u.real, version, u.soname))
    return out


def _judge(layout: Layout, family: Family, real: str) -> tuple[str, Candidate | None]:
    if not layout.inside(real):
        return f"resolves outside the prefix ({real})", None
    version = family.version_of(os.path.basename(real))
    if version is None:
        return f"the real file's name {os.path.basename(real)} carries no version", None
    soname = read_soname(real)
    if soname is None:
        return "not an ELF shared library with a SONAME", None
    so_version = family.version_of(soname)
    if so_version is None or so_version[0] != version[0]:
        return f"its SONAME {soname} does not match the version {'.'.join(map(str, version))} in its name", None
    return "", Candidate(real, version, soname)
