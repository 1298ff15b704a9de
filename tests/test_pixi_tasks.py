"""pixi.toml's tasks run as `pixi run` runs them (tests/pixi_emulator.py), on this CPU machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pixi_emulator import Workspace, render
from pixi_glob import collect_matching

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = Workspace(ROOT)
SETUP_CHAIN = ["doctor", "fix-links", "build-helpers", "build-apex", "smoke"]


def names(ran) -> list[str]:
    return [task.name for task, _ in ran]


def output(ran) -> str:
    return "\n".join(result.stdout + result.stderr for _, result in ran if result is not None)


@pytest.mark.parametrize("environment", sorted(WORKSPACE.manifest["environments"]))
def test_setup_runs_its_steps_in_depends_on_order(environment):
    order = [t.name for t in WORKSPACE.order(environment, "setup") if t.cmd]
    assert order == SETUP_CHAIN


@pytest.mark.parametrize("environment", sorted(WORKSPACE.manifest["environments"]))
def test_every_task_command_names_an_existing_script_or_gptforge_command(environment, cli):
    for task in WORKSPACE.tasks(environment).values():
        if task.cmd is None:
            continue
        words = task.cmd.split()
        if words[0] == "python" and words[1].startswith("tasks/"):
            assert (ROOT / words[1]).is_file(), task
        elif words[0] == "gptforge":
            sub = [w for w in words[1:] if not w.startswith("-")][:2]
            assert cli(*sub, "--help").returncode == 0, task
        else:
            assert words[:3] == ["python", "-m", "pytest"], task


def test_activation_points_cuda_home_at_each_layout():
    env = WORKSPACE.activation("cuda-13-0", "/opt/env", {"PATH": "/usr/bin"})
    assert env["CUDA_HOME"] == "/opt/env/lib/python3.12/site-packages/nvidia/cu13"
    assert env["PATH"].startswith("/opt/env/lib/python3.12/site-packages/nvidia/cu13/bin:/opt/env/bin")
    assert WORKSPACE.activation("cuda-12-9", "/opt/env", {})["CUDA_HOME"] == "/opt/env"
    assert "CUDA_HOME" not in WORKSPACE.activation("cpu", "/opt/env", {})


def test_the_cu13_activation_names_the_python_the_environment_pins():
    python = WORKSPACE.manifest["feature"]["cuda-13-0"]["dependencies"]["python"]
    home = WORKSPACE.manifest["feature"]["cuda-13-0"]["activation"]["env"]["CUDA_HOME"]
    assert f"python{python.removesuffix('.*')}/" in home


@pytest.fixture(scope="module")
def cpu_base_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    base = {k: v for k, v in __import__("os").environ.items() if k not in ("CUDA_HOME", "CONDA_PREFIX")}
    base.update(GPTFORGE_CACHE=str(home / "cache"), XDG_CACHE_HOME=str(home / "xdg"))
    return base


@pytest.fixture(scope="module")
def setup_on_cpu(cpu_base_env):
    return WORKSPACE.run("cpu", "setup", base_env=cpu_base_env)


@pytest.mark.slow  # the whole chain, a training run included: CI runs `pixi run setup` itself too
def test_setup_completes_on_a_cpu_machine_and_names_its_skips(setup_on_cpu):
    text = output(setup_on_cpu)
    assert names(setup_on_cpu) == SETUP_CHAIN, text
    assert all(result.returncode == 0 for _, result in setup_on_cpu), text
    skips = re.findall(r"^(\S+): skipped: (.+)$", text, re.M)
    assert [s for s, _ in skips] == ["fix-links", "build-apex"], text
    assert "no CUDA toolkit" in skips[0][1]
    assert re.search(r"ok   train: 30 steps of gpt2-tiny: validation loss ([\d.]+) -> ([\d.]+)", text), text
    assert "smoke: passed" in text


@pytest.mark.slow
def test_setup_leaves_a_stamp_in_the_prefix(setup_on_cpu):
    assert (Path(sys.prefix) / "share" / "gptforge" / "build-helpers.json").is_file()


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x", encoding="utf-8")


def test_the_glob_port_agrees_with_pixis_own_glob_tests(tmp_path):
    """crates/pixi_glob/src/glob_set/mod.rs at v0.77.0: the tests on hidden folders and anchoring."""
    for rel in (".pixi/foo_hidden.txt", ".foobar/foo_from_foobar.txt", ".foobar/build.txt",
                "recursive/foobar/.deep_hidden/foo_from_deep_hidden.txt", "some_text.txt", "subdir/pixi.toml",
                ".pixi/subdir/foo_hidden.txt", "exclude.txt", "subdir/include_subdir.txt", "include2.log"):
        touch(tmp_path / rel)
    assert collect_matching(tmp_path, ["**", ".foobar/foo_from_foobar.txt", "**/.deep_hidden/**"]) == [
        ".foobar/foo_from_foobar.txt", "exclude.txt", "include2.log",
        "recursive/foobar/.deep_hidden/foo_from_deep_hidden.txt", "some_text.txt", "subdir/include_subdir.txt",
        "subdir/pixi.toml"]
    assert collect_matching(tmp_path, [".pixi/subdir/**"]) == [".pixi/subdir/foo_hidden.txt"]
    assert "pixi.toml" not in collect_matching(tmp_path, ["pixi.toml"]) == []
    assert collect_matching(tmp_path, ["**/*.txt", "!exclude.txt"]) == ["some_text.txt", "subdir/include_subdir.txt"]
    assert collect_matching(tmp_path, ["!exclude.txt", "**/*.txt"]) == ["exclude.txt", "some_text.txt",
                                                                        "subdir/include_subdir.txt"]


def test_pixi_never_matches_a_glob_across_two_hidden_folders_or_a_plain_path_below_one(tmp_path):
    """The former output glob: the walker re-enters .pixi, never .gptforge, so no cache entry was saved."""
    touch(tmp_path / ".pixi/envs/cpu/.gptforge/build-helpers.json")
    touch(tmp_path / ".pixi/envs/cpu/share/gptforge/build-helpers.json")
    assert collect_matching(tmp_path, [".pixi/envs/*/.gptforge/*.json"]) == []
    assert collect_matching(tmp_path, [".pixi/envs/cpu/share/gptforge/build-helpers.json"]) == []
    for task in ("build-helpers", "build-apex"):
        outputs = [render(o, "cpu") for o in WORKSPACE.manifest["tasks"][task]["outputs"]]
        touch(tmp_path / f".pixi/envs/cpu/share/gptforge/{task}.json")
        assert collect_matching(tmp_path, outputs) == [f".pixi/envs/cpu/share/gptforge/{task}.json"]


@pytest.mark.slow  # it waits on the whole setup chain (setup_on_cpu)
def test_a_reinstalled_environment_builds_again(tmp_path, cpu_base_env, setup_on_cpu):
    """pixi's task cache: an unchanged rerun is skipped; a reinstall (a fresh prefix) runs the build again."""
    shutil.copy(ROOT / "pixi.toml", tmp_path / "pixi.toml")
    for name in ("src", "tasks"):
        (tmp_path / name).symlink_to(ROOT / name)
    workspace, prefix = Workspace(tmp_path), tmp_path / ".pixi" / "envs" / "cpu"
    base = {**cpu_base_env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), cpu_base_env["PATH"]])}

    def build() -> list:
        prefix.mkdir(parents=True, exist_ok=True)
        ran = workspace.run("cpu", "build-helpers", base_env=base, prefix=str(prefix))
        assert all(r is None or r.returncode == 0 for _, r in ran), output(ran)
        return [r is not None for _, r in ran]

    assert build() == [True]
    assert (prefix / "share" / "gptforge" / "build-helpers.json").is_file()
    assert build() == [False]               # skipped: inputs, outputs and command unchanged
    shutil.rmtree(prefix)                   # `pixi reinstall`: a new prefix, the old task cache
    assert build() == [True]


def test_a_failing_step_stops_the_chain(tmp_path):
    broken = dict(__import__("os").environ, CXX=str(tmp_path / "no-such-compiler"),
                  GPTFORGE_CACHE=str(tmp_path / "cache"))
    broken.pop("CONDA_PREFIX", None)
    ran = WORKSPACE.run("cpu", "setup", base_env=broken)
    assert names(ran)[-1] == "build-helpers" and ran[-1][1].returncode != 0


def test_task_arguments_are_appended_to_the_command(tmp_path, train_data_cache):
    ran = WORKSPACE.run("cpu", "train-gpt2", ["train-iters=3", "eval-interval=3", "lr-warmup-iters=1", "--run-dir",
                                              str(tmp_path / "r"), f"data-cache-dir={train_data_cache}"])
    text = output(ran)
    assert ran[-1][1].returncode == 0, text
    assert "training the tiny config (gpt2-tiny) on the CPU" in text
    assert (tmp_path / "r" / "checkpoints").is_dir()


def test_steps_script_refuses_an_unknown_step():
    out = subprocess.run([sys.executable, str(ROOT / "tasks" / "steps.py"), "build-everything"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "usage: python tasks/steps.py" in out.stderr


def _smoke_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smoke_task", ROOT / "tasks" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_in_the_hopper_environment_checks_its_kernel_packages_where_they_are_installed(capsys, monkeypatch, tmp_path):
    import importlib.util

    smoke = _smoke_module()
    real_find_spec = importlib.util.find_spec
    absent = {"flash_attn", "quack", "nvidia_cutlass_dsl"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real_find_spec(name, *a))
    assert smoke.hopper_checks() == [False, False, False]
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["FAIL flash_attn: not installed: pixi install -e hopper", "FAIL quack: not installed: pixi install -e hopper"]
    assert lines[2].startswith("FAIL CuTe DSL: not installed")
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    for top in ("flash_attn", "quack", "nvidia_cutlass_dsl"):
        (site / top).mkdir(parents=True)
        (site / top / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    assert smoke.hopper_checks() == [True, True, True]
    assert capsys.readouterr().out.splitlines()[2].startswith("ok   CuTe DSL: in ")
    monkeypatch.setattr("gptforge.core.installed.dsl_directory", lambda: str(tmp_path / "target" / "nvidia_cutlass_dsl"))
    assert smoke.hopper_checks()[2] is False  # a `pip install --target` outside site-packages
    assert "quack's kernel cache needs it in site-packages" in capsys.readouterr().out


def _step(name: str, tmp_path: Path, *args: str, path: str = "", **env: str) -> str:
    """The line a setup step prints, run outside any pixi environment with only PATH and ENV set."""
    import os

    keep = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "PIXI_ENVIRONMENT_NAME", "CONDA_PREFIX")}
    out = subprocess.run([sys.executable, str(ROOT / "tasks" / "steps.py"), name, *args], capture_output=True, text=True,
                         env={**keep, "PATH": f"{path}:{os.environ['PATH']}" if path else os.environ["PATH"], **env},
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def _gpus() -> list:
    from gptforge.probe.nvml import probe_nvml

    return probe_nvml()["gpus"]


@pytest.mark.skipif(bool(_gpus()), reason="a GPU is here: the step would build apex")
def test_build_apex_on_a_machine_without_a_gpu_says_so_wherever_the_toolkit_is(tmp_path):
    """nvcc on PATH and no CUDA_HOME (a venv on a CPU machine with a toolkit): the reason is the missing GPU,
    as the README says, not a missing toolkit of "the this environment"."""
    toolkit = tmp_path / "cuda" / "bin"
    toolkit.mkdir(parents=True)
    (toolkit / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    (toolkit / "nvcc").chmod(0o755)
    for where in ({"path": str(toolkit)}, {"CUDA_HOME": str(tmp_path / "cuda")}, {}):
        line = _step("build-apex", tmp_path, **where)
        assert line.startswith("build-apex: skipped: no NVIDIA GPU on this machine"), (where, line)


def test_fix_links_outside_pixi_names_what_it_repairs(tmp_path):
    line = _step("fix-links", tmp_path)
    assert line.startswith("fix-links: skipped: CUDA_HOME is not set"), line
    assert "the this" not in line and "gptforge fix-links --prefix" in line
    line = _step("fix-links", tmp_path, PIXI_ENVIRONMENT_NAME="cpu")
    assert line == "fix-links: skipped: the cpu environment has no CUDA toolkit (it sets no CUDA_HOME)", line
