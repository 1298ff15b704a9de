"""Nothing tells a user to run a pixi task or environment that does not exist: the docs, the source
(fix texts included), the task scripts and every command's --help are searched for `pixi run`."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from gptforge.compat.project_envs import environments
from gptforge.compat.rules import recommend

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = tomllib.loads((ROOT / "pixi.toml").read_text(encoding="utf-8"))
TASKS = set(MANIFEST["tasks"]) | {t for f in MANIFEST["feature"].values() for t in f.get("tasks", {})}
ENVIRONMENTS = set(MANIFEST["environments"])
# executables of the environment that `pixi run` also accepts in place of a task
EXECUTABLES = {"gptforge", "python", "pytest", "uv"}
# `-e ${{ matrix.environment }}` in a workflow is checked by tests/test_ci_workflow.py
PIXI_RUN = re.compile(r"pixi run((?:\s+(?:-e|--environment)\s+(?:\$\{\{[^}]*\}\}|\S+))*)\s+([A-Za-z][\w.-]*)")


def mentions(text: str):
    for match in PIXI_RUN.finditer(text):
        env = re.findall(r"(?:-e|--environment)\s+(\S+)", match.group(1))
        if env and env[0].startswith("${{"):
            env = []
        yield env[0] if env else None, match.group(2)


def problems(text: str, where: str) -> list[str]:
    found = []
    for env, name in mentions(text):
        if env is not None and env not in ENVIRONMENTS and env not in ("NAME", "ENV"):
            found.append(f"{where}: environment {env!r}")
        if name not in TASKS | EXECUTABLES:
            found.append(f"{where}: task {name!r}")
    return found


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "README.md", "docs", "src", "tasks", ".github", "pixi.toml", "flake.nix"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file() and not p.endswith((".json", ".lock"))]


def test_the_search_finds_what_it_should():
    assert list(mentions("pixi run -e cuda-13-0 setup and pixi run train-gpt2 x=1")) == [
        ("cuda-13-0", "setup"), (None, "train-gpt2")]
    assert problems("pixi run -e cuda-11-8 setup; pixi run install", "x") == [
        "x: environment 'cuda-11-8'", "x: task 'install'"]


def test_docs_source_and_scripts_name_only_real_tasks_and_environments():
    bad = []
    for path in tracked_files():
        bad += problems(path.read_text(encoding="utf-8", errors="replace"), str(path.relative_to(ROOT)))
    assert not bad


def help_texts(cli) -> str:
    top = cli("--help").stdout
    commands = re.findall(r"^    (\w[\w-]*)\s", top, re.M)
    texts = [top]
    for command in commands:
        text = cli(command, "--help").stdout
        texts.append(text)
        for sub in re.findall(r"^    (\w[\w-]*)\s", text, re.M):
            texts.append(cli(command, sub, "--help").stdout)
    return "\n".join(texts)


def test_every_help_text_names_only_real_tasks(cli):
    text = help_texts(cli)
    assert "fix-links" in text and "train" in text  # the help was really collected
    assert not problems(text, "--help")


@pytest.mark.parametrize("driver,gpus", [("525.60.13", ("7.0",)), ("575.57.08", ("12.0",)), ("580.65.06", ("9.0",))])
def test_recommendations_give_the_pixi_command_and_the_one_without_pixi(driver, gpus):
    from gptforge.compat.gpus import validate_cc

    result = recommend(driver, [validate_cc(g) for g in gpus]).to_json()
    assert not problems(result["setup"], "recommend")
    assert result["venv"] and "pixi" not in result["venv"]


@pytest.mark.parametrize("env", environments(), ids=lambda e: e.name)
def test_the_way_without_pixi_names_files_that_exist(env):
    for path in re.findall(r"envs/\S+", env.venv):
        assert (ROOT / path).is_file(), f"{env.name}: {path}"
