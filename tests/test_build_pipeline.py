"""The build pipeline on this CPU machine, end to end without nvcc: a small apex-shaped project (setup.py
with ENV_TO_FLAG and C extensions) goes through plan -> private copy -> extension filter -> pip wheel ->
logged run -> cache -> (no) install; plus sources from git, arch lists and build-log parsing."""

from __future__ import annotations

import os
import shutil
import sysconfig
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from gptforge.build import apex
from gptforge.build.runner import BuildProgress, last_error
from gptforge.build.source import clone, local_source, read_setup
from gptforge.build.toolchain import Toolchain
from gptforge.errors import UsageError

needs_c_toolchain = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("cc") is None
    or not Path(sysconfig.get_paths()["include"], "Python.h").exists(),
    reason="needs a C compiler and Python's headers (python3-dev) to build a real extension")


FAKE_SETUP = '''
import os, sys
from setuptools import Extension, setup
ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext"}
for env, flag in ENV_TO_FLAG.items():
    if os.environ.get(env) == "1":
        sys.argv.append(flag)
# like apex: APEX_PARALLEL_BUILD is read here
ext = []
if "--cpp_ext" in sys.argv:
    sys.argv.remove("--cpp_ext")
    ext.append(Extension("apex_C", ["csrc/a.c"]))
if "--cuda_ext" in sys.argv:
    sys.argv.remove("--cuda_ext")
    ext += [Extension("amp_C", ["csrc/b.c"]), Extension("syncbn", ["csrc/c.c"])]
setup(name="apex", version="0.1", packages=["apex"], ext_modules=ext)
'''


def c_module(name: str) -> str:
    return (f'#include <Python.h>\nstatic struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};\n'
            f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&m); }}\n")


@pytest.fixture
def fake_apex(tmp_path) -> Path:
    root = tmp_path / "apex-src"
    (root / "csrc").mkdir(parents=True)
    (root / "apex").mkdir()
    (root / "apex" / "__init__.py").write_text("")
    (root / "setup.py").write_text(FAKE_SETUP)
    for file, name in (("a.c", "apex_C"), ("b.c", "amp_C"), ("c.c", "syncbn")):
        (root / "csrc" / file).write_text(c_module(name))
    return root


def toolchain() -> Toolchain:
    return Toolchain(torch_version="2.11.0", torch_cuda="13.0", nvcc_version="13.0", cuda_home=None, ccs=("9.0",))


def built_modules(wheel: Path) -> set[str]:
    return {n.split(".")[0] for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")}


@needs_c_toolchain
def test_subset_of_extensions_is_built_from_a_private_copy(fake_apex, tmp_path):
    req = apex.ApexRequest(src=fake_apex, arch="9.0", jobs=2, cache_root=tmp_path / "cache", extensions=("apex_C", "amp_C"))
    plan, src = apex.plan_apex(req, toolchain())
    assert plan.flag_style == "env" and plan.env["APEX_CPP_EXT"] == "1"
    result = apex.build_and_install(plan, src, force=False, quiet=True, install=False)
    assert result["built"] is True
    assert built_modules(Path(result["wheel"])) == {"apex_C", "amp_C"}
    assert not (fake_apex / "build").exists() and not (fake_apex / "apex_setup.py").exists(), "--src stays untouched"
    log = Path(result["log"]).read_text()
    assert "pip" in log.splitlines()[0] and "apex_C" in log
    again = apex.build_and_install(plan, src, force=False, quiet=True, install=False)
    assert again["built"] is False and again["wheel"] == result["wheel"]


@needs_c_toolchain
def test_unknown_extension_fails_with_the_declared_names(fake_apex, tmp_path):
    req = apex.ApexRequest(src=fake_apex, arch="9.0", jobs=1, cache_root=tmp_path / "cache", extensions=("warp_C",))
    plan, src = apex.plan_apex(req, toolchain())
    with pytest.raises(Exception) as err:
        apex.build_and_install(plan, src, force=False, quiet=True, install=False)
    assert "declares no extension(s) ['warp_C']" in err.value.one_line()
    logs = list((tmp_path / "cache" / "apex" / "logs").glob("*.log"))
    assert len(logs) == 1, "the failed build's log is kept"
    assert not list((tmp_path / "cache" / "apex").glob(plan.cache_key)), "nothing half-written is published"


def test_apex_setup_is_read_not_executed(fake_apex):
    assert read_setup(fake_apex / "setup.py") == ({"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext"}, True)


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_source_is_the_exact_commit_and_dirty_trees_are_digested(fake_apex, tmp_path):
    _git(fake_apex, "init", "-q")
    _git(fake_apex, "add", ".")
    _git(fake_apex, "commit", "-q", "-m", "fake apex")
    commit = _git(fake_apex, "rev-parse", "HEAD")
    (fake_apex / "setup.py").write_text(FAKE_SETUP + "\n# later edit\n")
    _git(fake_apex, "commit", "-q", "-am", "later")
    got = clone(str(fake_apex), commit, tmp_path / "checkout")
    assert got.commit == commit and "later edit" not in (got.path / "setup.py").read_text()
    assert clone(str(fake_apex), commit, tmp_path / "checkout").path == got.path  # reused
    clean = local_source(fake_apex)
    assert clean.source_id == clean.commit
    (fake_apex / "csrc" / "a.c").write_text(c_module("apex_C") + "/* edit */\n")
    dirty = local_source(fake_apex)
    assert dirty.source_id.startswith(clean.commit + "+sha256:")
    with pytest.raises(UsageError):
        clone(str(fake_apex), commit[:8], tmp_path / "short")


@pytest.mark.parametrize("text,suffix,expected", [
    ("9.0", True, "9.0"), ("9.0a", True, "9.0a"), ("9.0a", False, "9.0"), ("9.0, 8.0", True, "8.0;9.0"),
    ("8.6+PTX;8.0", True, "8.0;8.6+PTX"), ("9.0+PTX;9.0a", False, "9.0+PTX"), ("10.0f 9.0a", False, "9.0;10.0"), ("9.0;9.0", True, "9.0"),
])
def test_arch_lists_are_normalised(text, suffix, expected):
    assert apex.normalise_arch_list(text, "13.0", suffix) == expected


@pytest.mark.parametrize("text", ["nine", "", "9.0+SASS", "7.0"])
def test_bad_arch_lists_are_usage_errors(text):
    with pytest.raises(UsageError):
        apex.normalise_arch_list(text, "13.0", True)  # 7.0 (Volta) is gone from nvcc 13


def test_build_log_progress_and_error_line(tmp_path):
    progress = BuildProgress()
    for line in ["  building 'amp_C' extension", "  building 'apex_C' extension", "  [1/15] nvcc -c a.cu",
                 "  [2/15] nvcc -c b.cu",
                 "  g++ -shared a.o -o build/lib.linux-x86_64-cpython-312/amp_C.cpython-312-x86_64-linux-gnu.so"]:
        progress.feed(line)
    assert progress.describe(12) == "1/12 extensions linked, 2 compile steps done"
    log = tmp_path / "b.log"
    log.write_text("x\n  csrc/a.cu(3): error: identifier \"foo\" is undefined\n  FAILED: a.o\n"
                   "  RuntimeError: Error compiling objects for extension\nerror: subprocess-exited-with-error\n")
    assert last_error(log) == "RuntimeError: Error compiling objects for extension"
    log.write_text("ninja: build stopped\n  csrc/a.cu(3): error: identifier \"foo\" is undefined\n  FAILED: a.o\n")
    assert last_error(log).startswith("csrc/a.cu(3): error")


def test_preflight_shows_every_finding_of_one_code():
    """torch 2.13+cu126 with nvcc 11.8 and gcc 9: gcc and nvcc both lack C++20, and the preflight says both,
    so fixing gcc does not lead to a second failed build on nvcc."""
    from gptforge.build import preflight
    from gptforge.probe import probe_machine
    from gptforge.probe.machine import Compiler

    here = probe_machine()
    machine = replace(here, torch=replace(here.torch, installed=True, version="2.13.0+cu126", cuda="12.6", arch_list=[],
                                          error=None),
                      nvcc=replace(here.nvcc, version="11.8"),
                      compilers=replace(here.compilers, nvcc_host=Compiler("g++-9", "CC", "/usr/bin/g++-9", "gcc", "9.5.0", None)))
    cxx = [f.message for f in preflight.apex_findings(machine) if f.code == "cxx-standard-unsupported"]
    assert len(cxx) == 2, cxx
    assert any("gcc 9.5.0" in m for m in cxx) and any("nvcc 11.8" in m for m in cxx)
