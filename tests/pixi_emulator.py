"""Runs pixi.toml's tasks the way `pixi run -e ENV TASK` does, where no pixi binary is available.

What pixi does and this repeats: the tasks visible in an environment are the workspace's [tasks]
plus those of the environment's features; `depends-on` runs first, depth first, each task once; a
task runs in the workspace root (or its `cwd`), with the environment activated: the features'
[activation.env] on top of the caller's environment (`$VAR` expanded), PIXI_PROJECT_ROOT,
PIXI_ENVIRONMENT_NAME, PIXI_PROJECT_MANIFEST and CONDA_PREFIX set, the prefix's bin/ first on PATH;
extra arguments are appended to the command. The environment's prefix here is the running
interpreter's (the test venv), standing in for .pixi/envs/ENV, unless the caller names one.

Task caching as pixi 0.77.0 does it (crates/pixi_task/src/task_hash.rs, executable_task.rs, and
crates/pixi_cli/src/run.rs): a task with `inputs` or `outputs` is skipped when the hash of its
command, the files its globs select (tests/pixi_glob.py) and its environment equals the one saved
in .pixi/task-cache-v0/ after its last successful run; no entry is saved while a configured glob
selects no file. Globs are rendered first; `{{ pixi.environment.name }}` is the one variable used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import string
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pixi_glob import file_hashes


@dataclass(frozen=True)
class Task:
    name: str
    cmd: str | None
    depends_on: tuple[str, ...]
    cwd: str | None
    env: dict
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None


def _task(name: str, spec) -> Task:
    if isinstance(spec, str):
        return Task(name, spec, (), None, {})
    if isinstance(spec, list):  # an alias: a list of task names
        return Task(name, None, tuple(spec), None, {})
    depends = spec.get("depends-on", ())
    depends = (depends,) if isinstance(depends, str) else tuple(d if isinstance(d, str) else d["task"] for d in depends)
    globs = {key: tuple(spec[key]) if key in spec else None for key in ("inputs", "outputs")}
    return Task(name, spec.get("cmd"), depends, spec.get("cwd"), spec.get("env", {}), **globs)


def render(glob: str, environment: str) -> str:
    rendered = re.sub(r"\{\{\s*pixi\.environment\.name\s*\}\}", environment, glob)
    if "{{" in rendered:
        raise ValueError(f"the emulator renders only pixi.environment.name: {glob}")
    return rendered


class Workspace:
    def __init__(self, root: Path):
        self.root = root
        self.manifest = tomllib.loads((root / "pixi.toml").read_text(encoding="utf-8"))

    def features(self, environment: str) -> list[dict]:
        spec = self.manifest["environments"][environment]
        names = spec if isinstance(spec, list) else spec["features"]
        default = [] if isinstance(spec, dict) and spec.get("no-default-feature") else [self.manifest]
        return default + [self.manifest["feature"][n] for n in names]

    def tasks(self, environment: str) -> dict[str, Task]:
        found: dict[str, Task] = {}
        for feature in self.features(environment):
            for name, spec in feature.get("tasks", {}).items():
                found[name] = _task(name, spec)
        return found

    def activation(self, environment: str, prefix: str, base: dict) -> dict:
        env = {**base, "PIXI_PROJECT_ROOT": str(self.root), "PIXI_ENVIRONMENT_NAME": environment,
               "PIXI_PROJECT_MANIFEST": str(self.root / "pixi.toml"), "CONDA_PREFIX": prefix,
               "CONDA_DEFAULT_ENV": environment}
        env["PATH"] = os.pathsep.join([os.path.join(prefix, "bin"), base.get("PATH", "")])
        for feature in self.features(environment):
            for key, value in feature.get("activation", {}).get("env", {}).items():
                env[key] = string.Template(value).safe_substitute(env)
        return env

    def order(self, environment: str, task: str) -> list[Task]:
        tasks, done, out = self.tasks(environment), set(), []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in path:
                raise ValueError(f"depends-on cycle: {' -> '.join(path + (name,))}")
            if name in done:
                return
            if name not in tasks:
                raise KeyError(f"task {name!r} is not defined for environment {environment!r}")
            for dep in tasks[name].depends_on:
                visit(dep, path + (name,))
            done.add(name)
            out.append(tasks[name])

        visit(task, ())
        return out

    def globbed(self, environment: str, globs: tuple[str, ...] | None) -> dict | None:
        """InputHashes/OutputHashes::from_task: None where no glob is configured or none selects a file."""
        if not globs:
            return None
        return file_hashes(self.root, [render(g, environment) for g in globs]) or None

    def task_hash(self, environment: str, task: Task, command: str) -> tuple[str | None, bool]:
        """TaskHash::computation_hash (None without inputs and outputs), and whether save_cache may save
        it (every configured glob selected something). pixi's EnvironmentHash stands here as the
        environment's name and pixi.lock's bytes."""
        inputs, outputs = self.globbed(environment, task.inputs), self.globbed(environment, task.outputs)
        if inputs is None and outputs is None:
            return None, False
        lock = self.root / "pixi.lock"
        digest = hashlib.sha256(json.dumps([command, environment], sort_keys=True).encode())
        digest.update(lock.read_bytes() if lock.is_file() else b"")
        for files in (inputs, outputs):
            for rel, data in sorted((files or {}).items()):
                digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
            digest.update(b"\1" if files is None else b"\2")
        savable = not (task.inputs and inputs is None) and not (task.outputs and outputs is None)
        return digest.hexdigest(), savable

    def cache_file(self, environment: str, task: Task, args) -> Path:
        args_hash = hashlib.sha256(json.dumps([list(args), task.inputs, task.outputs]).encode()).hexdigest()[:16]
        return self.root / ".pixi" / "task-cache-v0" / f"{environment}-{task.name}-{args_hash}.json"

    def run_one(self, environment: str, task: Task, args=(), *, base_env: dict | None = None,
                prefix: str = sys.prefix, timeout: float = 900) -> subprocess.CompletedProcess:
        """One task's command, without what it depends on (`pixi run --skip-deps`)."""
        env = self.activation(environment, prefix, dict(os.environ if base_env is None else base_env))
        command = task.cmd + "".join(" " + shlex.quote(a) for a in args)
        cwd = self.root / task.cwd if task.cwd else self.root
        return subprocess.run(["bash", "-c", command], cwd=cwd, env={**env, **task.env},
                              capture_output=True, text=True, timeout=timeout)

    def run(self, environment: str, task: str, args=(), *, base_env: dict | None = None,
            prefix: str = sys.prefix, timeout: float = 900) -> list[tuple[Task, subprocess.CompletedProcess]]:
        """Run TASK and what it depends on; stops at the first failure, like pixi. A task that pixi's
        cache skips is listed with None for its result."""
        chain = [t for t in self.order(environment, task) if t.cmd is not None]
        ran = []
        for step in chain:
            step_args = args if step is chain[-1] else ()
            cache = self.cache_file(environment, step, step_args)
            before, _ = self.task_hash(environment, step, step.cmd)
            if before is not None and cache.is_file() and json.loads(cache.read_text())["hash"] == before:
                ran.append((step, None))
                continue
            result = self.run_one(environment, step, step_args, base_env=base_env, prefix=prefix, timeout=timeout)
            ran.append((step, result))
            if result.returncode != 0:
                break
            after, savable = self.task_hash(environment, step, step.cmd)
            if after is not None and savable:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps({"hash": after}))
        return ran
