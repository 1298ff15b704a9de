"""`gptforge build apex|deepspeed-ops` on this CPU machine with its real nvcc (CUDA_HOME) and CPU torch; a torch
CUDA version is simulated with --torch-cuda (the preflight's input), never by mocking nvcc. The cases run the command
in this process; test_cpu_torch_is_reported_with_a_fix starts the installed entry point."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import one_line_error, run_cli, run_main

CUDA_HOME = os.environ.get("GPTFORGE_TEST_CUDA_HOME", "/usr/local/cuda")
needs_nvcc = pytest.mark.skipif(not Path(CUDA_HOME, "bin", "nvcc").exists(),
                                reason=f"no CUDA toolkit at {CUDA_HOME} (set GPTFORGE_TEST_CUDA_HOME)")
PINNED = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"


@pytest.fixture
def cli():
    return run_main


def _env(tmp_path) -> dict:
    return {"CUDA_HOME": CUDA_HOME, "GPTFORGE_CACHE": str(tmp_path / "cache")}


def _json(proc) -> dict:
    return json.loads(proc.stdout)


def _codes(report: dict) -> dict:
    return {f["code"]: f for f in report["findings"]}


@needs_nvcc
def test_cpu_torch_is_reported_with_a_fix(cli, tmp_path):
    proc = run_cli("build", "apex", "--arch", "9.0", env=_env(tmp_path))
    assert proc.returncode == 1
    assert "[torch-no-cuda]" in proc.stderr and "fix: " in proc.stderr  # the code, and its fix under it
    assert "Traceback" not in proc.stderr
    report = _json(cli("build", "apex", "--arch", "9.0", "--json", env=_env(tmp_path)))
    assert report["ok"] is False and _codes(report)["torch-no-cuda"]["severity"] == "error"
    assert not (tmp_path / "cache" / "apex").exists(), "a failed preflight builds and writes nothing"


@needs_nvcc
def test_torch_cuda_12_8_against_real_nvcc_13_is_a_mismatch(cli, tmp_path):
    proc = cli("build", "apex", "--arch", "9.0", "--torch-cuda", "12.8", "--json", env=_env(tmp_path))
    assert proc.returncode == 1
    codes = _codes(_json(proc))
    assert codes["nvcc-torch-mismatch"]["severity"] == "error"
    assert "13.0" in codes["nvcc-torch-mismatch"]["message"] and "12.8" in codes["nvcc-torch-mismatch"]["message"]
    assert codes["nvcc-torch-mismatch"]["fix"]
    assert codes["apex-nvcc-mismatch"]["severity"] == "error"  # apex refuses even a minor difference


@needs_nvcc
def test_minor_mismatch_is_fatal_for_apex_only(cli, tmp_path):
    report = _json(cli("build", "apex", "--arch", "9.0", "--torch-cuda", "13.2", "--json", env=_env(tmp_path)))
    assert _codes(report)["apex-nvcc-mismatch"]["severity"] == "error"
    assert report["ok"] is False


@needs_nvcc
def test_incomplete_cuda_home_points_at_the_real_toolkit(cli, tmp_path):
    fake = tmp_path / "cuda"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "nvcc").symlink_to(Path(CUDA_HOME, "bin", "nvcc").resolve())
    proc = cli("build", "apex", "--arch", "9.0", "--torch-cuda", "13.0", "--json",
               env={**_env(tmp_path), "CUDA_HOME": str(fake)})
    finding = _codes(_json(proc))["cuda-home-incomplete"]
    assert "include/cuda_runtime.h" in finding["message"]
    assert finding["fix"].startswith("export CUDA_HOME=")
    assert proc.returncode == 1


@needs_nvcc
def test_dry_run_plans_the_pinned_commit(cli, tmp_path):
    proc = cli("build", "apex", "--dry-run", "--arch", "9.0a", "--torch-cuda", "13.0", "--jobs", "16", "--json",
               env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    plan = _json(proc)["plan"]
    assert plan["commit"] == PINNED and plan["source"].startswith("git https://github.com/NVIDIA/apex.git")
    assert plan["arch_list"] == "9.0a"
    assert plan["flag_style"] == "env"
    env = plan["env"]
    assert env["APEX_CPP_EXT"] == env["APEX_CUDA_EXT"] == "1"
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0a"
    assert (env["APEX_PARALLEL_BUILD"], env["MAX_JOBS"]) == ("12", "8")
    assert "--no-build-isolation" in plan["pip_command"]
    assert len(plan["cache_key"]) == 20 and plan["key_inputs"]["source"] == PINNED
    assert {"apex_C", "amp_C", "fused_layer_norm_cuda"} <= set(plan["expected_extensions"])
    assert not (tmp_path / "cache").exists(), "a dry run fetches and writes nothing"
    again = _json(cli("build", "apex", "--dry-run", "--arch", "9.0a", "--torch-cuda", "13.0", "--jobs", "16", "--json",
                      env=_env(tmp_path)))
    assert again["plan"]["cache_key"] == plan["cache_key"]
    other = _json(cli("build", "apex", "--dry-run", "--arch", "9.0", "--torch-cuda", "13.0", "--json", env=_env(tmp_path)))
    assert other["plan"]["cache_key"] != plan["cache_key"]


@needs_nvcc
def test_dry_run_human_plan_names_every_part(cli, tmp_path):
    proc = cli("build", "apex", "--dry-run", "--arch", "9.0", "--torch-cuda", "13.0", env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for part in ("source:", "commit:", "arch list:", "jobs:", "flags:", "env:", "command:", "cache:"):
        assert part in proc.stdout


# apex's tree is not in the repository (a build fetches the pinned commit): a checkout of yours makes it run
@needs_nvcc
@pytest.mark.skipif(not os.environ.get("GPTFORGE_APEX_SRC"), reason="set GPTFORGE_APEX_SRC to an apex checkout")
def test_dry_run_reads_a_local_source(cli, tmp_path):
    src = Path(os.environ["GPTFORGE_APEX_SRC"])
    plan = _json(cli("build", "apex", "--dry-run", "--src", str(src), "--arch", "9.0", "--torch-cuda", "13.0", "--json",
                     "--extensions", "apex_C,amp_C,fused_layer_norm_cuda", env=_env(tmp_path)))["plan"]
    assert plan["source"] == f"--src {src.resolve()}"
    assert plan["source_id"] == (plan["commit"] or plan["source_id"])
    assert plan["env"]["GPTFORGE_APEX_EXTENSIONS"] == "apex_C,amp_C,fused_layer_norm_cuda"
    assert plan["expected_extensions"] == ["apex_C", "amp_C", "fused_layer_norm_cuda"]


@needs_nvcc
def test_deepspeed_gets_an_arch_list_its_parser_accepts(cli, tmp_path):
    proc = cli("build", "deepspeed-ops", "--dry-run", "--version", "0.19.8", "--arch", "9.0a", "--torch-cuda", "13.0",
               "--ops", "fused_adam", "--json", env={**_env(tmp_path), "TORCH_CUDA_ARCH_LIST": "9.0a"})
    assert proc.returncode == 0, proc.stderr
    plan = _json(proc)["plan"]
    assert plan["arch_list"] == "9.0" and plan["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert plan["env"]["DS_BUILD_FUSED_ADAM"] == "1" and plan["env"]["DS_BUILD_OPS"] == "0"
    assert "DS_BUILD_CPU_ADAM" not in plan["env"] and "cpu" not in plan["key_inputs"]
    with_cpu = _json(cli("build", "deepspeed-ops", "--dry-run", "--version", "0.19.8", "--arch", "9.0", "--torch-cuda",
                         "13.0", "--ops", "cpu_adam,fused_adam", "--json", env=_env(tmp_path)))["plan"]
    assert with_cpu["ops"] == ["cpu_adam", "fused_adam"] and with_cpu["env"]["DS_BUILD_CPU_ADAM"] == "1"
    assert with_cpu["key_inputs"]["cpu"], "-march=native CPU ops are keyed by the CPU model"


@needs_nvcc
def test_deepspeed_reports_a_cuda_home_without_lib64(cli, tmp_path):
    fake = tmp_path / "cuda"
    (fake / "bin").mkdir(parents=True)
    (fake / "include").mkdir()
    (fake / "bin" / "nvcc").symlink_to(Path(CUDA_HOME, "bin", "nvcc").resolve())
    (fake / "include" / "cuda_runtime.h").symlink_to(Path(CUDA_HOME, "include", "cuda_runtime.h").resolve())
    proc = cli("build", "deepspeed-ops", "--dry-run", "--version", "0.19.8", "--arch", "9.0", "--torch-cuda", "13.0",
               "--json", env={**_env(tmp_path), "CUDA_HOME": str(fake)})
    assert proc.returncode == 1
    assert "gptforge fix-links" in _codes(_json(proc))["cuda-home-no-lib64"]["fix"]


def _one_line_usage_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@needs_nvcc
@pytest.mark.parametrize("args,needles", [
    (["apex", "--arch", "nine"], ["--arch: 'nine' is not a GPU architecture"]),
    (["apex", "--arch", "99.0"], ["--arch: nvcc 13.0 cannot target 99.0"]),
    (["apex", "--arch", "9.0", "--ref", "abc"], ["--ref: 'abc' is not a full commit hash"]),
    (["apex", "--arch", "9.0", "--extensions", ",,"], ["--extensions: ',,' names no extension"]),
    (["deepspeed-ops", "--arch", "9.0", "--version", "latest"], ["--version: 'latest' is not a version"]),
])
def test_a_bad_flag_is_named_even_when_the_toolchain_fails(cli, tmp_path, args, needles):
    """The CPU torch here fails the preflight; a wrong flag is still the error the user sees."""
    _one_line_usage_error(cli("build", *args, "--dry-run", env=_env(tmp_path)), *needles)


@needs_nvcc
@pytest.mark.parametrize("package", [["apex"], ["deepspeed-ops", "--version", "0.19.8", "--ops", "fused_adam"]])
def test_an_unwritable_cache_is_a_usage_error(cli, tmp_path, package):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = cli("build", *package, "--arch", "9.0", "--torch-cuda", "13.0", "--cache", str(blocker / "cache"),
               env=_env(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gptforge: usage error: --cache: the wheel cache")
    assert blocker.read_text() == "" and not (tmp_path / "cache").exists()


def test_bad_usage_is_one_line_exit_2(cli, tmp_path):
    proc = cli("build", "apex", "--arch", "nine", "--torch-cuda", "13.0", "--dry-run", env=_env(tmp_path))
    _one_line_usage_error(proc, "--arch: 'nine' is not a GPU architecture")
    bad_ops = cli("build", "deepspeed-ops", "--ops", "warp_drive", "--dry-run", env=_env(tmp_path))
    assert bad_ops.returncode == 2 and "--ops: unknown op(s) warp_drive" in bad_ops.stderr
    assert len(bad_ops.stderr.strip().splitlines()) == 1
    bad_src = cli("build", "apex", "--src", str(tmp_path), "--dry-run", "--torch-cuda", "13.0", env=_env(tmp_path))
    _one_line_usage_error(bad_src, "is not an apex source tree")
    not_deepspeed = cli("build", "deepspeed-ops", "--src", str(tmp_path), "--dry-run", env=_env(tmp_path))
    _one_line_usage_error(not_deepspeed, "is not a DeepSpeed source tree")


def test_build_helpers_is_a_build_command():
    from gptforge.cli import build_parser, modules_for

    argv = ["build", "helpers", "--force"]
    assert modules_for(argv) == ("build",)
    args = build_parser(modules_for(argv)).parse_args(argv)
    assert args.func.__module__ == "gptforge.cli.build" and args.force is True


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_ops_without_deepspeed_says_what_to_install_or_pass(cli, tmp_path):
    """docs/build.md's `gptforge build deepspeed-ops --ops fused_adam,cpu_adam` builds the installed DeepSpeed's
    ops; where none is installed the one line says so, and what to do, instead of "no version to build"."""
    proc = cli("build", "deepspeed-ops", "--ops", "fused_adam,cpu_adam", env=_env(tmp_path), cwd=tmp_path)
    one_line_error(proc, 2, "--version: DeepSpeed is not installed here", "--version X.Y.Z", "--src")
