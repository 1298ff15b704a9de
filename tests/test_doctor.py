"""`gptforge doctor` on this machine, through the installed entry point, and its rules on probe data."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import typing
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from conftest import (codes, conda_like_prefix, doctor, doctor_json, documented_codes, emitted_codes,
                      gptforge_executable, needs_cudart, needs_nvcc, NVCC, _real_nvcc_release, SCHEMA, TOOLKIT)
from gptforge.compat.findings import Severity
from gptforge.doctor import fp8_usable, rule_findings
from gptforge.doctor.checks import live_findings
from gptforge.probe.machine import Machine

REPO = Path(__file__).resolve().parents[1]
APEX_SRC = os.environ.get("GPTFORGE_APEX_SRC") or str(REPO / "third_party" / "apex")



@pytest.fixture(scope="module")
def here():
    """doctor --json on this machine as it is (build variables cleared)."""
    return doctor_json()


@pytest.fixture(scope="module")
def here_text():
    """doctor's printout on this machine as it is (build variables cleared)."""
    return doctor()


def test_schema_is_valid_draft_2020_12():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_json_validates_and_exit_code_follows_ok(here):
    done, data = here
    assert done.returncode == (0 if data["ok"] else 1)
    assert data["ok"] == (not codes(data, "error"))


def test_no_driver_is_reported_and_the_rest_is_checked(here, here_text):
    _, data = here
    if data["machine"]["driver"]["status"] == "ok":
        pytest.skip("this machine has an NVIDIA driver")
    assert data["machine"]["driver"]["status"] == "no-driver"
    assert "no-gpu" in codes(data, "info")
    assert data["machine"]["torch"]["installed"] and data["machine"]["compilers"]["gxx"]["version"]
    text = here_text  # no driver is not an error: the exit status is whatever else this machine has
    assert "no-gpu" in text.stdout and text.returncode == (1 if codes(data, "error") else 0)


@pytest.fixture(scope="module")
def with_toolkit():
    """doctor --json with CUDA_HOME at the real toolkit and its bin first on PATH."""
    return doctor_json(CUDA_HOME=TOOLKIT, PATH=f"{TOOLKIT}/bin:{os.environ['PATH']}")


@needs_nvcc
def test_nvcc_is_found_and_parsed(with_toolkit):
    _, data = with_toolkit
    nvcc = data["machine"]["nvcc"]
    assert nvcc["cuda_home"]["path"] == NVCC
    assert nvcc["cuda_home"]["version"] == nvcc["version"] == _real_nvcc_release()
    assert nvcc["agree"] is True
    assert "nvcc-path-disagree" not in codes(data)


@needs_nvcc
def test_the_toolkit_runtime_number_follows_nvcc(with_toolkit):
    """cudaRuntimeGetVersion's number is major * 1000 + minor * 10 of the release nvcc prints."""
    major, minor = map(int, _real_nvcc_release().split("."))
    _, data = with_toolkit
    assert data["machine"]["cuda_home"]["libcudart"]["encoded_version"] == major * 1000 + minor * 10


@needs_cudart
def test_the_probe_own_libcudart_load_is_not_reported_as_loaded(with_toolkit):
    """The CUDA-root probe loads the toolkit's libcudart to ask its version; that is not what training loads."""
    _, data = with_toolkit
    m = data["machine"]
    assert m["cuda_home"]["libcudart"]["version"] == _real_nvcc_release()
    if m["torch"]["cuda"] is None:
        assert m["libcudart_loaded"] == []  # a CPU torch maps no CUDA runtime
    assert "libcudart-multiple" not in codes(data)


@needs_cudart
def test_conda_layout_cuda_home_gives_layout_warnings_and_strict_fails(tmp_path):
    root = conda_like_prefix(tmp_path / "env", TOOLKIT)
    done, data = doctor_json(CUDA_HOME=str(root))
    assert {"cuda-home-no-lib64", "cuda-home-no-headers"} <= codes(data, "warning")
    fixes = {f["code"]: f["fix"] for f in data["findings"]}
    assert f"ln -sfn lib {root}/lib64" in fixes["cuda-home-no-lib64"]
    assert data["machine"]["nvcc"]["cuda_home"]["version"] == _real_nvcc_release()
    assert done.returncode == 0 and data["ok"] is True
    strict, strict_data = doctor_json("--strict", CUDA_HOME=str(root))  # the printout exits through the same call
    assert strict.returncode == 1 and strict_data["ok"] is False


@needs_cudart
def test_lib64_link_clears_the_warning(tmp_path):
    root = conda_like_prefix(tmp_path / "env", TOOLKIT)
    (root / "lib64").symlink_to("lib")
    _, data = doctor_json(CUDA_HOME=str(root))
    assert "cuda-home-no-lib64" not in codes(data)
    assert data["machine"]["cuda_home"]["lib64"] == "symlink"


@pytest.fixture(scope="module")
def missing_cuda_home(tmp_path_factory):
    """CUDA_HOME at no directory, whose name looks like rich markup: (path, doctor --json, doctor's printout)."""
    missing = str(tmp_path_factory.mktemp("home") / "no-such-cuda[/][bold]x")
    return missing, doctor_json(CUDA_HOME=missing), doctor(CUDA_HOME=missing)


def test_nonexistent_cuda_home_is_an_error_without_traceback(missing_cuda_home):
    missing, (done, data), text = missing_cuda_home
    assert "cuda-home-not-found" in codes(data, "error")
    assert done.returncode == 1
    assert text.returncode == 1
    for word in ("machine", "findings", "nvcc", "torch", "cuda-home-not-found", missing,
                 "unset CUDA_HOME or point it at a CUDA toolkit"):
        assert word in text.stdout


def test_paths_are_printed_as_they_are_not_as_rich_markup(missing_cuda_home):
    odd, _, text = missing_cuda_home
    assert text.returncode == 1 and text.stdout.count(odd) >= 2  # the nvcc and CUDA root rows of the machine table


def test_transformer_engine_that_exits_on_import_is_an_error_not_an_exit(tmp_path):
    """A package without metadata whose module calls sys.exit() on import (as a broken build script can)."""
    package = tmp_path / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pytorch.py").write_text("import sys\nsys.exit('built for another torch')\n")
    done, data = doctor_json(PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    (finding,) = [f for f in data["findings"] if f["code"] == "te-import-failed"]
    assert "SystemExit: built for another torch" in finding["message"] and "None" not in finding["message"]
    assert done.returncode == 1


def test_transformer_engine_beside_a_system_cudnn_names_torchs_cudnn_as_the_fix(tmp_path):
    """TE's loader prefers a system cuDNN; next to torch's pip cuDNN a sub-library of the system one fails to load
    (the error TE 2.20.2 gave on an H100 image with a system cuDNN 9.14 and torch's 9.19, BENCHMARKS.md run 81)."""
    package = tmp_path / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pytorch.py").write_text(
        "raise OSError('/lib/x86_64-linux-gnu/libcudnn_heuristic.so.9: undefined symbol: "
        "_ZTVN5cudnn7backend12OperationSetE, version libcudnn_graph.so.9')\n")
    cudnn_lib = tmp_path / "nvidia" / "cudnn" / "lib"
    cudnn_lib.mkdir(parents=True)
    done, data = doctor_json(PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    assert data["machine"]["transformer_engine"]["pip_cudnn_lib"] == str(cudnn_lib)
    (finding,) = [f for f in data["findings"] if f["code"].startswith("te-")]
    assert finding["code"] == "te-system-cudnn" and finding["severity"] == "error"
    assert "libcudnn_heuristic.so.9: undefined symbol" in finding["message"]
    assert finding["fix"].startswith(f"export LD_LIBRARY_PATH={cudnn_lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    assert done.returncode == 1


def test_cuda_home_that_is_a_file_is_an_error_that_says_so(tmp_path):
    afile = tmp_path / "cuda"
    afile.write_text("")
    done, data = doctor_json(CUDA_HOME=str(afile))
    (finding,) = [f for f in data["findings"] if f["code"] == "cuda-home-not-found"]
    assert finding["severity"] == "error" and "is not a directory" in finding["message"]
    assert done.returncode == 1


def test_broken_nvcc_on_path_is_one_error(tmp_path):
    """A broken nvcc first on PATH, CUDA_HOME unset: the root is guessed from that nvcc, reported once."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'segmentation fault' >&2\nexit 139\n")
    nvcc.chmod(0o755)
    done, data = doctor_json(PATH=f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    broken = [f for f in data["findings"] if f["code"] == "nvcc-broken"]
    assert len(broken) == 1 and broken[0]["severity"] == "error" and str(nvcc) in broken[0]["message"]
    assert done.returncode == 1


@needs_nvcc
def test_host_compiler_that_is_not_an_executable_is_reported(tmp_path):
    not_a_compiler = tmp_path / "gcc"
    not_a_compiler.write_text("")
    _, data = doctor_json(CUDA_HOME=TOOLKIT, CC=str(not_a_compiler))
    assert data["machine"]["compilers"]["nvcc_host"]["path"] is None
    assert "host-compiler-not-found" in codes(data, "warning")


# apex's real Python package without its extensions: its tree is not in the repository (third_party/ is yours)
@pytest.mark.skipif(not (Path(APEX_SRC) / "apex" / "__init__.py").exists(),
                    reason="apex sources absent (set GPTFORGE_APEX_SRC)")
def test_python_only_apex_is_an_error():
    """apex's own Python package without its compiled extensions, as a Python-only install leaves it."""
    pythonpath = os.pathsep.join(p for p in (APEX_SRC, os.environ.get("PYTHONPATH")) if p)
    done, data = doctor_json(PYTHONPATH=pythonpath)
    finding = next(f for f in data["findings"] if f["code"] == "apex-python-only")
    assert "No module named 'fused_layer_norm_cuda'" in finding["message"] and finding["severity"] == "error"
    assert done.returncode == 1


def test_help_explains_exit_status():
    done = subprocess.run([*gptforge_executable(), "doctor", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--strict" in done.stdout and "Exit status" in done.stdout


# The rules on probe data: this machine's real probe, with one fact changed the way another machine has it.

@pytest.fixture(scope="module")
def machine(here):
    return here[1]["machine"]


def _gpu_machine(machine: dict, torch_cuda: str, loaded: list[str]) -> dict:
    m = copy.deepcopy(machine)
    m["driver"].update(status="ok", driver_version="580.65.06", cuda_version="13.0", error=None,
                       gpus=[{"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                              "memory_total_mib": 81559, "memory_free_mib": 81000}])
    m["torch"].update(installed=True, version="2.11.0+cu130", cuda=torch_cuda, cuda_available=True, device_count=1)
    m["libcudart_loaded"] = [{"path": p, "real_path": p, "version": v, "encoded_version": None}
                             for p, v in (item.split("=") for item in loaded)]
    return m


def _severity(findings, code):
    return {f.severity for f in findings if f.code == code}


def test_rule_loaded_runtime_older_than_torch_is_an_error(machine):
    m = _gpu_machine(machine, "13.0", ["/env/lib/libcudart.so.12.4=12.4"])
    assert _severity(live_findings(Machine.from_json(m)), "libcudart-version-mismatch") == {Severity.ERROR}


def test_rule_loaded_runtime_newer_minor_is_a_warning(machine):
    m = _gpu_machine(machine, "13.0", ["/env/lib/libcudart.so.13=13.2"])
    assert _severity(live_findings(Machine.from_json(m)), "libcudart-version-mismatch") == {Severity.WARNING}


def test_rule_matching_runtime_is_quiet(machine):
    m = _gpu_machine(machine, "13.0", ["/env/lib/libcudart.so.13=13.0"])
    assert not {f.code for f in live_findings(Machine.from_json(m))} & {"libcudart-version-mismatch", "libcudart-multiple"}


def test_rule_two_runtime_majors_in_one_process_is_an_error(machine):
    m = _gpu_machine(machine, "13.0", ["/a/libcudart.so.13=13.0", "/b/libcudart.so.12=12.8"])
    assert _severity(live_findings(Machine.from_json(m)), "libcudart-multiple") == {Severity.ERROR}


def test_rule_cpu_torch_on_a_gpu_machine_is_left_to_the_engine(machine):
    m = _gpu_machine(machine, None, [])
    m["torch"]["version"] = "2.13.0+cpu"
    assert "torch-cpu-only" not in {f.code for f in live_findings(Machine.from_json(m))}
    assert "torch-cpu-build" in {f.code for f in rule_findings(Machine.from_json(m))}


def test_rule_unreadable_cuda_home_is_an_error(machine):
    m = copy.deepcopy(machine)
    m["cuda_home"].update(path="/opt/cuda", source="CUDA_HOME", exists=True, readable=False, lib=False, lib64=None,
                          cuda_runtime_h=None, headers_only_in_targets=False, libcudart=None)
    m["nvcc"]["cuda_home"] = {"path": "/opt/cuda/bin/nvcc", "real_path": None, "version": None, "toolkit_root": None,
                              "host_compiler": None, "error": "/opt/cuda/bin/nvcc does not exist or is not executable"}
    found = [f for f in live_findings(Machine.from_json(m)) if f.code.startswith("cuda-home")]
    assert [(f.code, f.severity) for f in found] == [("cuda-home-unreadable", Severity.ERROR)]


def test_rule_nvcc_disagreement(machine):
    m = copy.deepcopy(machine)
    entry = {"path": "/opt/cuda-12.4/bin/nvcc", "real_path": "/opt/cuda-12.4/bin/nvcc", "version": "12.4",
             "toolkit_root": "/opt/cuda-12.4", "host_compiler": "gcc", "error": None}
    m["nvcc"].update(cuda_home=entry, path={**entry, "path": "/usr/bin/nvcc", "version": "13.0"}, agree=False)
    finding = next(f for f in live_findings(Machine.from_json(m)) if f.code == "nvcc-path-disagree")
    assert finding.severity == Severity.WARNING and "12.4" in finding.message and "13.0" in finding.message


def test_fp8_usable_follows_the_engine(machine):
    hopper = _gpu_machine(machine, "13.0", [])
    assert fp8_usable(Machine.from_json(hopper), rule_findings(Machine.from_json(hopper))) is True
    ampere = copy.deepcopy(hopper)
    ampere["driver"]["gpus"][0].update(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    assert fp8_usable(Machine.from_json(ampere), rule_findings(Machine.from_json(ampere))) is False
    assert fp8_usable(Machine.from_json(machine), []) is (None if not machine["driver"]["gpus"] else True)


def test_every_doctor_code_is_documented():
    """Each code the doctor's own checks emit has a row in docs/doctor.md, no row is stale, none is the engine's."""
    emitted = emitted_codes(REPO / "src/gptforge/doctor")
    assert "cuda-home-no-lib64" in emitted and len(emitted) >= 20
    assert emitted == documented_codes(REPO / "docs/doctor.md", "Findings the doctor adds (live-machine checks)")
    assert not emitted & emitted_codes(REPO / "src/gptforge/compat")


def _schema_node(node: dict) -> dict:
    """A schema node with its $ref followed and its object branch of a oneOf taken."""
    if "$ref" in node:
        return _schema_node(SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if "oneOf" in node:
        return _schema_node(next(branch for branch in node["oneOf"] if branch.get("type") != "null"))
    return node


def _dataclass_in(hint):
    """The dataclass a field holds: itself, or inside ``X | None``, ``list[X]``, ``dict[str, X]``."""
    if dataclasses.is_dataclass(hint):
        return hint
    return next((found for arg in typing.get_args(hint) if (found := _dataclass_in(arg))), None)


def _assert_fields_are_schema(cls, node: dict, where: str) -> None:
    node = _schema_node(node)
    assert {f.name for f in dataclasses.fields(cls)} == set(node["properties"]), where
    for name, hint in typing.get_type_hints(cls).items():
        if inner := _dataclass_in(hint):
            child = node["properties"][name]
            child = child.get("items") or child.get("additionalProperties") or child
            _assert_fields_are_schema(inner, child, f"{where}.{name}")


def test_typed_machine_is_the_schema_and_reads_the_json_back(machine):
    _assert_fields_are_schema(Machine, SCHEMA["$defs"]["machine"], "machine")
    typed = Machine.from_json(machine)
    assert typed.to_json() == machine
    assert typed.combination().python == ".".join(machine["python"]["version"].split(".")[:2])


def _machine_rows(text: str) -> list[str]:
    """The names in the first column of the `machine` table of a doctor printout."""
    lines = [line.rstrip() for line in text.splitlines()]
    table = lines[lines.index("machine") + 1:lines.index("findings")]
    return [line.split("│")[1].strip() for line in table if line.startswith("│")]


def test_the_docs_sample_is_a_real_runs_printout(here_text):
    """docs/doctor.md shows what doctor prints: the rows of its machine table and, read through a pipe, one line
    per finding."""
    shown = (REPO / "docs" / "doctor.md").read_text().split("$ gptforge doctor\n", 1)[1].split("```", 1)[0]
    real = here_text.stdout
    assert _machine_rows(shown) == _machine_rows(real)
    rows = [line for line in shown.split("\nfindings\n", 1)[1].splitlines() if line.startswith("│ ")]
    assert rows and all(row.split("│")[1].strip() for row in rows)  # no row folded onto a second line
