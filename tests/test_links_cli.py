"""fix-links example tests: the command line, where the prefix and the CUDA version come from,
exit codes, and the refusals (files, outside links, read-only). The command runs in this process (run_main) outside
an active environment; the module entry point is started as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ACTIVATION_VARS, _clean_env, install_library, run_main, snapshot, symlink, write
from gptforge.errors import UsageError
from gptforge.links.expected import expected_cuda


def _run(*args, env=None):
    return run_main(*args, env={**dict.fromkeys(ACTIVATION_VARS), **(env or {})})


def test_module_entry_point_is_the_same_command(env):
    out = subprocess.run([sys.executable, "-m", "gptforge.links", "--prefix", env, "--json"],
                         capture_output=True, text=True, env=_clean_env())
    assert out.returncode == 0 and json.loads(out.stdout)["applied"] == 4
    bad = subprocess.run([sys.executable, "-m", "gptforge.links", "--prefix", env, "--cuda", "x"],
                         capture_output=True, text=True, env=_clean_env())
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_help_explains_exit_codes(cli):
    out = cli("fix-links", "--help")
    assert out.returncode == 0
    assert "Exit status: 0" in out.stdout and "--undo" in out.stdout


def test_no_active_environment_is_a_usage_error():
    out = _run("fix-links")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--prefix" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("bad", ["13", "twelve", "12.x", "", "\uff11\uff12.\uff18", "12.8\x1b[2J\n"])
def test_bad_cuda_is_a_usage_error(env, bad):
    out = _run("fix-links", "--prefix", env, "--cuda", bad)
    assert out.returncode == 2 and "--cuda" in out.stderr and out.stderr.count("\n") == 1


def test_not_a_prefix_is_a_usage_error(tmp_path):
    out = _run("fix-links", "--prefix", str(tmp_path))
    assert out.returncode == 2 and "no lib/" in out.stderr


def test_prefix_from_conda_prefix_and_pixi(env, tmp_path):
    out = _run("fix-links", "--dry-run", "--json", env={"CONDA_PREFIX": env})
    assert out.returncode == 0 and json.loads(out.stdout)["prefix"] == os.path.realpath(env)
    project = tmp_path / "proj"
    (project / ".pixi" / "envs").mkdir(parents=True)
    os.symlink(env, project / ".pixi" / "envs" / "cuda128")
    out = _run("fix-links", "--dry-run", "--json",
               env={"PIXI_PROJECT_ROOT": str(project), "PIXI_ENVIRONMENT_NAME": "cuda128"})
    assert out.returncode == 0 and json.loads(out.stdout)["prefix"] == os.path.realpath(env)


def test_cuda_from_flag_then_record(env):
    report = json.loads(_run("fix-links", "--prefix", env, "--dry-run", "--json").stdout)
    assert (report["cuda"], report["cuda_source"]) == ("12.8", "conda-meta/cuda-version-12.8-h5d125a7_3.json")
    report = json.loads(_run("fix-links", "--prefix", env, "--cuda", "12.4", "--dry-run", "--json").stdout)
    assert (report["cuda"], report["cuda_source"]) == ("12.4", "--cuda")


def test_record_path_does_not_import_torch(env):
    code = ("import sys; from gptforge.links.expected import expected_cuda; "
            f"print(expected_cuda(None, {env!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split("\n")[1] == "False"


def test_falls_back_to_torch_and_says_so_when_torch_has_no_cuda(env):
    os.unlink(os.path.join(env, "conda-meta", "cuda-version-12.8-h5d125a7_3.json"))
    import torch

    if torch.version.cuda is None:
        with pytest.raises(UsageError, match="no CUDA build of torch") as err:
            expected_cuda(None, env)
        assert err.value.flag == "--cuda"
    else:
        assert expected_cuda(None, env)[0] == tuple(map(int, torch.version.cuda.split(".")[:2]))


def test_dry_run_runs_nothing_from_the_prefix(env):
    """A dry run used to import torch with the prefix's python under a 300 s timeout."""
    os.unlink(os.path.join(env, "conda-meta", "cuda-version-12.8-h5d125a7_3.json"))
    python = os.path.join(env, "bin", "python")
    write(python, b"#!/bin/sh\ntouch \"$0.ran\"\nsleep 1000\n")
    os.chmod(python, 0o755)
    out = _run("fix-links", "--prefix", env, "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "a dry run does not run the environment's python" in out.stderr and "pass --cuda" in out.stderr
    assert not os.path.exists(python + ".ran")


@pytest.mark.parametrize("record,needle", [
    ("12.8", "holds a JSON float, not a package record"),
    ('["12.8"]', "holds a JSON list, not a package record"),
    ('"12.8"', "holds a JSON str, not a package record"),
    ('{"version": 12.8}', "12.8 is a float, not a version string"),
    ('{"version": ["12", "8"]}', "is a list, not a version string"),
    ('{"version": "\uff11\uff12.\uff18"}', "is not a CUDA version"),
])
def test_malformed_cuda_version_record(env, record, needle):
    path = os.path.join(env, "conda-meta", "cuda-version-12.8-h5d125a7_3.json")
    write(path, record.encode())
    out = _run("fix-links", "--prefix", env, "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "cuda-version-12.8-h5d125a7_3.json" in out.stderr and needle in out.stderr


def test_dry_run_changes_nothing_then_fix_then_nothing_to_do(env):
    before = snapshot(env)
    out = _run("fix-links", "--prefix", env, "--dry-run")
    assert out.returncode == 0 and "would change 4 of 4" in out.stdout, out.stdout + out.stderr
    assert snapshot(env) == before
    out = _run("fix-links", "--prefix", env)
    assert out.returncode == 0, out.stdout
    assert "verified lib/libcudart.so: cudaRuntimeGetVersion = 12080" in out.stdout
    assert os.readlink(os.path.join(env, "lib64")) == "lib"
    # no include/ at all: include itself becomes the link
    assert os.readlink(os.path.join(env, "include")) == "targets/x86_64-linux/include"
    assert open(os.path.join(env, "include", "cuda_runtime.h")).read() == "/* 12.8 */\n"
    again = _run("fix-links", "--prefix", env, "--json")
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["steps"] == [] and report["ok"]


@pytest.mark.parametrize("kind", ["file", "wrong-link"])
def test_lib64_file_or_wrong_link_is_reported_untouched(env, kind):
    lib64 = os.path.join(env, "lib64")
    write(lib64, b"x") if kind == "file" else os.symlink("targets", lib64)
    identity = lambda: (os.lstat(lib64).st_ino, os.lstat(lib64).st_mode, os.lstat(lib64).st_mtime_ns,  # noqa: E731
                        os.readlink(lib64) if os.path.islink(lib64) else open(lib64, "rb").read())
    before = identity()
    out = _run("fix-links", "--prefix", env, "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and "links-lib64-conflict" in [f["code"] for f in report["findings"]]
    assert identity() == before
    # everything else was still repaired
    assert os.path.realpath(os.path.join(env, "lib", "libcudart.so")).endswith("libcudart.so.12.8.90")


def test_headers_linked_one_by_one_into_an_existing_include(env):
    write(os.path.join(env, "include", "Python.h"), b"/* python */")
    assert _run("fix-links", "--prefix", env).returncode == 0
    assert os.readlink(os.path.join(env, "include", "cuda_runtime.h")) == "../targets/x86_64-linux/include/cuda_runtime.h"
    assert not os.path.islink(os.path.join(env, "include"))


def test_real_lib64_directory_is_left_alone(env):
    write(os.path.join(env, "lib64", "libmine.so"), b"mine")
    out = _run("fix-links", "--prefix", env, "--json")
    assert out.returncode == 0
    assert "links-lib64-dir" in [f["code"] for f in json.loads(out.stdout)["findings"]]
    assert os.path.isdir(os.path.join(env, "lib64")) and not os.path.islink(os.path.join(env, "lib64"))


def test_soname_name_held_by_a_file_is_not_replaced(env):
    os.unlink(os.path.join(env, "lib", "libcudart.so.12"))
    write(os.path.join(env, "lib", "libcudart.so.12"), b"a copy, not a link")
    out = _run("fix-links", "--prefix", env, "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and "links-name-blocked" in [f["code"] for f in report["findings"]]
    assert open(os.path.join(env, "lib", "libcudart.so.12"), "rb").read() == b"a copy, not a link"


def test_runtime_outside_the_prefix_is_never_linked(env, tmp_path):
    outside = install_library(str(tmp_path / "elsewhere"), "libcudart", (12, 8, 95), place="lib")
    symlink(outside, os.path.join(env, "lib", "libcudart.so.12.8.95"))
    report = json.loads(_run("fix-links", "--prefix", env, "--json").stdout)
    assert report["chosen"]["libcudart"]["file"] == "targets/x86_64-linux/lib/libcudart.so.12.8.90"
    ignored = [f for f in report["findings"] if f["code"] == "links-candidate-ignored"]
    assert ignored and "outside the prefix" in ignored[0]["message"]
    for root, dirs, files in os.walk(env):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path) and path != os.path.join(env, "lib", "libcudart.so.12.8.95"):
                assert os.path.realpath(path).startswith(os.path.realpath(env))


def test_link_that_would_lead_outside_is_refused(tmp_path):
    """lib is itself a link out of the prefix: lib64 -> lib would lead outside, so nothing is done."""
    outside = tmp_path / "shared-lib"
    outside.mkdir()
    prefix = tmp_path / "env"
    prefix.mkdir()
    os.symlink(outside, prefix / "lib")
    before = snapshot(str(prefix))
    out = _run("fix-links", "--prefix", str(prefix), "--cuda", "12.8", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and "links-outside-prefix" in [f["code"] for f in report["findings"]]
    assert snapshot(str(prefix)) == before and report["applied"] == 0


def test_no_runtime_for_the_expected_cuda_exits_1_and_says_why(env):
    out = _run("fix-links", "--prefix", env, "--cuda", "12.6", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1
    [finding] = [f for f in report["findings"] if f["code"] == "links-no-match"]
    assert "libcudart" in finding["message"] and "12.4.127" in finding["message"] and "12.8.90" in finding["message"]


def test_read_only_lib_changes_nothing(env):
    lib = os.path.join(env, "lib")
    root = os.geteuid() == 0
    if root:
        if subprocess.run(["chattr", "+i", lib], capture_output=True).returncode != 0:
            pytest.skip("running as root without chattr +i: chmod cannot make a directory read-only for root")
    else:
        os.chmod(lib, 0o555)
    try:
        before = snapshot(env)
        out = _run("fix-links", "--prefix", env, "--json")
        report = json.loads(out.stdout)
        assert out.returncode == 1 and "links-read-only" in [f["code"] for f in report["findings"]]
        assert snapshot(env) == before
    finally:
        subprocess.run(["chattr", "-i", lib], capture_output=True) if root else os.chmod(lib, 0o755)


def test_undo_dry_run_shows_and_keeps(env):
    assert _run("fix-links", "--prefix", env).returncode == 0
    fixed = snapshot(env)
    out = _run("fix-links", "--prefix", env, "--undo", "--dry-run", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["mode"] == "undo (dry run)" and len(report["steps"]) == 4
    assert snapshot(env) == fixed


def test_undo_without_record_is_a_no_op(env):
    out = _run("fix-links", "--prefix", env, "--undo", "--json")
    assert out.returncode == 0
    assert [f["code"] for f in json.loads(out.stdout)["findings"]] == ["links-nothing-to-undo"]


def test_cudnn_rule_newest_per_major(tmp_path):
    prefix = str(tmp_path / "env")
    for v in [(8, 9, 7, 29), (9, 1, 0, 70), (9, 10, 2, 21)]:
        install_library(prefix, "libcudnn", v)
    symlink("libcudnn.so.9.1.0.70", os.path.join(prefix, "lib", "libcudnn.so.9"))
    out = _run("fix-links", "--prefix", prefix, "--cuda", "12.8", "--json")
    assert out.returncode == 0, out.stdout
    lib = os.path.join(prefix, "lib")
    real = lambda n: os.path.basename(os.path.realpath(os.path.join(lib, n)))  # noqa: E731
    assert real("libcudnn.so") == "libcudnn.so.9.10.2.21"
    assert real("libcudnn.so.9") == "libcudnn.so.9.10.2.21"
    assert real("libcudnn.so.8") == "libcudnn.so.8.9.7.29"


@pytest.mark.parametrize("name", ["my env", "ünï cødé 🎉"])
def test_prefix_path_with_spaces_and_unicode_is_verified(tmp_path, name):
    prefix = str(tmp_path / name)
    install_library(prefix, "libcudart", (12, 8, 90))
    out = _run("fix-links", "--prefix", prefix, "--cuda", "12.8", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0, report["findings"]
    assert {v["path"]: v["runtime_version"] for v in report["verified"]} == {"lib/libcudart.so": 12080, "lib/libcudart.so.12": 12080}
