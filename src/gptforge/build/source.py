"""Where apex's source comes from (``--src`` or a git clone of a commit) and what its setup.py supports; the
pinned native-build sources (pins.toml: data, updated deliberately)."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from gptforge.errors import GptforgeError, UsageError
from gptforge.storage import publish_dir

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@cache
def pins() -> dict:
    return tomllib.loads(resources.files("gptforge.build").joinpath("pins.toml").read_text())


def apex_pin() -> dict:
    return pins()["apex"]


def deepspeed_pin() -> dict:
    return pins()["deepspeed"]


@dataclass(frozen=True)
class ApexSource:
    path: Path
    commit: str | None  # git HEAD of the tree; None for a copy that is not a git checkout
    source_id: str  # the commit, or "sha256:<digest of the tree>" when there is none (cache key input)
    env_to_flag: dict[str, str] | None  # setup.py's ENV_TO_FLAG, None on apex that predates it
    parallel_build: bool  # setup.py reads APEX_PARALLEL_BUILD


def read_setup(setup_py: Path) -> tuple[dict[str, str] | None, bool]:
    """apex's ENV_TO_FLAG table (parsed, not executed: setup.py imports torch) and APEX_PARALLEL_BUILD support."""
    text = setup_py.read_text()
    env_to_flag = None
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ENV_TO_FLAG" for t in node.targets):
            env_to_flag = ast.literal_eval(node.value)
    return env_to_flag, "APEX_PARALLEL_BUILD" in text


SKIP_DIRS = {".git", "build", "dist", "__pycache__"}


def tree_digest(root: Path) -> str:
    """Content digest of a source tree that is not a git checkout (build outputs skipped)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() if not path.is_symlink() else os.readlink(path).encode())
    return digest.hexdigest()[:16]


def git_commit(path: Path) -> str | None:
    if not (path / ".git").exists():
        return None
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def is_dirty(path: Path) -> bool:
    out = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True)
    return out.returncode != 0 or bool(out.stdout.strip())


def local_source(src: Path) -> ApexSource:
    src = src.expanduser().resolve()
    if not (src / "setup.py").is_file() or not (src / "csrc").is_dir():
        raise UsageError("--src", f"{src} is not an apex source tree (no setup.py and csrc/)",
                         "point --src at a checkout of https://github.com/NVIDIA/apex")
    env_to_flag, parallel = read_setup(src / "setup.py")
    commit = git_commit(src)
    if commit is None:
        source_id = f"sha256:{tree_digest(src)}"
    elif is_dirty(src):  # local edits: the commit alone would not name what gets built
        source_id = f"{commit}+sha256:{tree_digest(src)}"
    else:
        source_id = commit
    return ApexSource(src, commit, source_id, env_to_flag, parallel)


def clone(repo: str, commit: str, dest: Path) -> ApexSource:
    """Exactly ``commit`` of ``repo`` at ``dest``: fetched into a private directory, then renamed into
    place, so builders sharing ``dest`` never see half a checkout. Reused when already there."""
    if not COMMIT_RE.match(commit):
        raise UsageError("--ref", f"{commit!r} is not a full commit hash", "give the 40-character commit")
    if git_commit(dest) != commit:
        if shutil.which("git") is None:
            raise GptforgeError("git is not installed", "install git, or pass --src DIR with an apex checkout")
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        steps = [["init", "-q"], ["remote", "add", "origin", repo], ["fetch", "-q", "--depth", "1", "origin", commit],
                 ["checkout", "-q", "FETCH_HEAD"]]
        for step in steps:
            out = subprocess.run(["git", "-C", str(tmp), *step], capture_output=True, text=True)
            if out.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise GptforgeError(f"git {step[0]} of apex {commit} from {repo} failed: {reason}",
                                    "on a machine without network pass --src DIR with an apex checkout")
        if git_commit(dest) == commit:  # another builder finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            publish_dir(tmp, dest, replace=True)
    env_to_flag, parallel = read_setup(dest / "setup.py")
    return ApexSource(dest, commit, commit, env_to_flag, parallel)
