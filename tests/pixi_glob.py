"""Which files a task's `inputs`/`outputs` globs select, by pixi 0.77.0's rules (crates/pixi_glob).

pixi hashes the files that `FileHashes::from_files` (crates/pixi_task/src/file_hashes.rs) finds: a
pattern naming a directory becomes DIR/**, then `GlobSet::create` walks the workspace root with the
`ignore` crate's override matcher (crates/pixi_glob/src/glob_set/walk.rs, `walk_globs`):

- gitignore syntax, the last matching pattern wins, `!` excludes; a pattern without `/` matches a
  name at any depth, one with `/` the whole path from the root; `*` never crosses `/`;
- a bare file name is anchored to the root (`anchor_literal_pattern`);
- hidden entries (names starting with `.`) are skipped, unless a pattern names one: then pixi appends
  `!{**/.*, .*, .**/*}` and whitelists again only the first hidden folder of each pattern (or the
  parent folder of a pattern without glob characters) (`set_ignore_hidden_patterns`). A pattern that
  crosses a second hidden folder, or names a file below a hidden folder without any glob
  character, therefore matches nothing: the walker never enters that folder;
- a directory is entered unless a pattern excludes it; a file is kept only if a pattern includes it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

META = set("*?[{")
HIDE_ALL = "!{**/.*, .*, .**/*}"


def anchor_literal_pattern(pattern: str) -> str:
    negated, body = (True, pattern[1:]) if pattern.startswith("!") else (False, pattern)
    if body and not body.startswith(("./", "/", "../")) and "/" not in body and not META & set(body):
        body = "/" + body
    return ("!" if negated else "") + body


def set_ignore_hidden_patterns(patterns: list[str]) -> list[str] | None:
    """Port of walk.rs `set_ignore_hidden_patterns`, branch for branch."""
    user_includes_hidden = any(p.startswith(".") or ("/." in p and not p.startswith("!.")) for p in patterns)
    if any(p.startswith("!**/.*") for p in patterns):
        return None
    requested_everything = any(p in ("**", "./**", "**/*", "./**/*") for p in patterns)
    if any(p in (".*", ".**", "**/.*", "./.*", ".**/*") for p in patterns):
        return list(patterns)
    if not (requested_everything or user_includes_hidden):
        return None
    result = [*patterns, HIDE_ALL]
    for p in patterns:
        if not (p.startswith(".") or "/." in p) or p.startswith("!."):
            continue
        if not any(c in p for c in "*?[") and "/" in p:       # a specific file below a hidden folder
            folder = p[:p.rfind("/")]
            result += [folder, f"!{folder}/*", p]
        elif p.startswith("."):
            result.append(p.split("/", 1)[0])
        else:
            result.append(p[p.find("/.") + 1:].split("/", 1)[0])
    return result


def _regex(glob: str) -> str:
    """globset with literal_separator: `*`, `?`, `[...]`, `{a,b}`, `**/`, `/**`."""
    out, i, depth = [], 0, 0
    while i < len(glob):
        c = glob[i]
        at_component_start = i == 0 or glob[i - 1] in "/{,"
        if glob.startswith("**/", i) and at_component_start:
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append("[^/]*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = glob.index("]", i + 2)
            body = glob[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        elif c == "{":
            out.append("(?:")
            depth += 1
            i += 1
        elif c == "," and depth:
            out.append("|")
            i += 1
        elif c == "}" and depth:
            out.append(")")
            depth -= 1
            i += 1
        elif c == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


class Overrides:
    """ignore::overrides::Override: gitignore lines, inverted (a plain line includes, `!` excludes)."""

    def __init__(self, lines: list[str]):
        self.globs = []
        for line in lines:
            include = not line.startswith("!")
            body = line if include else line[1:]
            anchored = body.startswith("/")
            body = body.lstrip("/")
            only_dir = body.endswith("/")
            body = body.rstrip("/")
            if not anchored and "/" not in body and not body.startswith("**/"):
                body = "**/" + body
            if body.endswith("/**"):
                body += "/*"
            self.globs.append((re.compile(_regex(body) + r"\Z"), include, only_dir))
        self.whitelists = sum(include for _, include, _ in self.globs)

    def matched(self, rel: str, is_dir: bool) -> bool | None:
        """True: included, False: excluded, None: no pattern says."""
        found = None
        for regex, include, only_dir in self.globs:
            if (is_dir or not only_dir) and regex.match(rel):
                found = include
        if found is None and self.whitelists and not is_dir:
            return False
        return found


def collect_matching(root: Path, patterns: list[str]) -> list[str]:
    """The files (relative, `/`-separated) that pixi's GlobSet selects under ROOT."""
    patterns = [anchor_literal_pattern(p) for p in patterns]
    hidden = set_ignore_hidden_patterns(patterns)
    overrides = Overrides(patterns + (hidden or []))
    skip_hidden = hidden is None
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        base = Path(folder).relative_to(root).as_posix()

        def keep(name: str, is_dir: bool) -> bool:
            verdict = overrides.matched(name if base == "." else f"{base}/{name}", is_dir)
            if verdict is not None:
                return verdict
            return not (skip_hidden and name.startswith("."))

        dirs[:] = [d for d in dirs if keep(d, True)]
        found += [f if base == "." else f"{base}/{f}" for f in files if keep(f, False)]
    return sorted(found)


def file_hashes(root: Path, filters: list[str]) -> dict[str, bytes]:
    """FileHashes::from_files: a filter naming a directory selects everything below it."""
    patterns = []
    for f in filters:
        if f.endswith("/"):
            patterns.append(f + "**")
        elif (root / f).is_dir():
            patterns.append(f + "/**")
        else:
            patterns.append(f)
    return {rel: (root / rel).read_bytes() for rel in collect_matching(root, patterns)}
