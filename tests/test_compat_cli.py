"""`gptforge compat check` / `compat recommend` through the installed entry point."""

from __future__ import annotations

import io
import json
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.cli import main


def check_json(cli, *args):
    result = cli("compat", "check", *args, "--json")
    return result, json.loads(result.stdout)


def test_acceptance_driver_too_old_names_a_cuda12_environment(cli):
    result, report = check_json(cli, "--driver", "535.104.05", "--cc", "9.0", "--torch", "2.11.0+cu130")
    assert result.returncode == 1
    assert report["ok"] is False
    (finding,) = [f for f in report["findings"] if f["code"] == "driver-too-old"]
    assert finding["severity"] == "error"
    assert "pixi run -e cuda-12-" in finding["fix"]
    # and the table output says the same
    table = cli("compat", "check", "--driver", "535.104.05", "--cc", "9.0", "--torch", "2.11.0+cu130")
    assert table.returncode == 1 and "driver-too-old" in table.stdout


def test_acceptance_h100_cuda_12_4_gcc_13_is_ok(cli):
    result = cli("compat", "check", "--driver", "550.54.14", "--cc", "9.0", "--cuda", "12.4", "--gcc", "13")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout
    _, report = check_json(cli, "--driver", "550.54.14", "--cc", "9.0", "--cuda", "12.4", "--gcc", "13")
    assert report["ok"] is True and not [f for f in report["findings"] if f["severity"] == "error"]


def test_acceptance_volta_on_cuda_13(cli):
    result, report = check_json(cli, "--cc", "7.0", "--cuda", "13.0")
    assert result.returncode == 1
    assert "gpu-arch-unsupported" in {f["code"] for f in report["findings"]}
    assert {f["severity"] for f in report["findings"] if f["code"] == "gpu-arch-unsupported"} == {"error"}


def test_acceptance_gcc_14_on_cuda_12_6(cli):
    result, report = check_json(cli, "--cuda", "12.6", "--gcc", "14")
    assert result.returncode == 1
    assert [f["code"] for f in report["findings"]] == ["gcc-unsupported"]


def test_json_shape(cli):
    _, report = check_json(cli, "--gpu", "NVIDIA H100 80GB HBM3", "--torch", "2.13.0+cu126", "--python", "3.9")
    assert set(report) == {"ok", "findings"}
    for finding in report["findings"]:
        assert set(finding) == {"code", "severity", "message", "fix"}
        assert finding["severity"] in {"error", "warning", "info"}
    assert "python-unsupported" in {f["code"] for f in report["findings"]}


def test_gpu_names_and_ccs_combine(cli):
    result, report = check_json(cli, "--gpu", "A100-SXM4-40GB", "--cc", "12.0", "--torch", "2.6.0+cu124")
    assert result.returncode == 1
    (finding,) = [f for f in report["findings"] if f["code"] == "gpu-arch-not-in-torch"]
    assert "12.0" in finding["message"]


@pytest.mark.parametrize(
    "args, flag",
    [(["--driver", "banana"], "--driver"), (["--cc", "99.1"], "--cc"), (["--gpu", "Radeon RX 7900"], "--gpu"),
     (["--torch", "2.11.0+cu130", "--torch-cuda", "12.8"], "--torch-cuda"), (["--gcc", "gcc-13"], "--gcc"),
     (["--cuda", "twelve"], "--cuda"), (["--torch", "latest"], "--torch"), (["--python", "2.7"], "--python"),
     (["--driver", "580.65.06", "--driver", "535.104.05"], "--driver"), (["--cuda", "12.4", "--cuda", "13.0"], "--cuda"),
     (["--driver", "580.65.06\nfoo"], "--driver"), (["--gpu", "H1\n00"], "--gpu"),
     (["--cc", "９.０"], "--cc"), (["--gcc", "１３"], "--gcc"), (["--cudnn", "0000"], "--cudnn"), (["--apex", ""], "--apex"),
     (["--torch-arch-list", "sm_90 sm_999"], "--torch-arch-list")],
)
def test_bad_input_is_one_line_exit_2(cli, args, flag):
    result = cli("compat", "check", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


VALUE_FLAGS = ["--driver", "--gpu", "--cc", "--cuda", "--torch", "--torch-cuda", "--python", "--gcc", "--clang",
               "--cudnn", "--nccl", "--apex", "--deepspeed", "--transformer-engine", "--torch-arch-list", "--arch-list"]


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(VALUE_FLAGS), st.text(max_size=24) | st.from_regex(r"[0-9a-z_.+ ;-]{0,12}", fullmatch=True))
def test_any_value_gets_an_answer_or_a_one_line_usage_error(flag, value):
    """In-process, so that hypothesis can try many values: exit 0/1 with JSON, or exit 2 with one line naming the flag."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["compat", "check", flag, value, "--json"])
        except SystemExit as exit:
            code = exit.code
    if code == 2:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and flag in lines[0] and out.getvalue() == ""
    else:
        assert code in (0, 1) and err.getvalue() == ""
        assert json.loads(out.getvalue())["ok"] is (code == 0)


def test_the_same_value_twice_is_not_a_conflict(cli):
    result, report = check_json(cli, "--cc", "9.0", "--cc", "9.0", "--driver", "580.65.06", "--driver", "580.65.06")
    assert result.returncode == 0 and report == {"ok": True, "findings": []}


def test_recommend(cli):
    result = cli("compat", "recommend", "--driver", "580.65.06", "--gpu", "H100", "--json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["environment"] == "cuda-13-0" and report["setup"] == "pixi run -e cuda-13-0 setup"
    assert {e["name"] for e in report["environments"]} == {"cpu", "cuda-12-6", "cuda-12-9", "cuda-13-0", "hopper"}
    assert [e["name"] for e in report["faster"]] == ["hopper"]
    assert "faster on these GPUs: hopper: pixi run -e hopper setup" in cli("compat", "recommend", "--driver", "580.65.06",
                                                                          "--gpu", "H100").stdout.replace("\n", " ")
    table = cli("compat", "recommend", "--driver", "535.104.05", "--cc", "7.0")
    assert table.returncode == 0 and "pixi run -e cuda-12-6 setup" in table.stdout


def test_recommend_names_the_hopper_variant_only_where_every_gpu_runs_its_kernels(cli):
    mixed = json.loads(cli("compat", "recommend", "--driver", "580.65.06", "--gpu", "H100", "--gpu", "A100", "--json").stdout)
    assert mixed["environment"] == "cuda-13-0" and mixed["faster"] == []
    hopper = next(e for e in mixed["environments"] if e["name"] == "hopper")
    assert not hopper["fits"] and hopper["reasons"] == ["its own kernels run on sm_90 only, not on CC 8.0: use cuda-13-0 there"]
    no_gpus = json.loads(cli("compat", "recommend", "--driver", "580.65.06", "--json").stdout)
    assert no_gpus["environment"] == "cuda-13-0" and no_gpus["faster"] == []
    old_driver = json.loads(cli("compat", "recommend", "--driver", "575.51.03", "--gpu", "H100", "--json").stdout)
    assert old_driver["environment"] == "cuda-12-9" and old_driver["faster"] == []


def test_recommend_exits_1_with_the_reason_when_nothing_fits(cli):
    result = cli("compat", "recommend", "--driver", "470.82.01", "--cc", "8.0")
    assert result.returncode == 1
    assert "no CUDA environment fits" in result.stderr and "525.60.13" in result.stderr
    report = json.loads(cli("compat", "recommend", "--driver", "470.82.01", "--cc", "8.0", "--json").stdout)
    assert report["ok"] is False and report["environment"] is None


def test_recommend_usage_errors(cli):
    result = cli("compat", "recommend", "--driver", "x")
    assert result.returncode == 2 and "--driver" in result.stderr and "Traceback" not in result.stderr


def _nvml_status() -> str:
    from gptforge.probe.nvml import probe_nvml

    return probe_nvml()["status"]


@pytest.mark.skipif(_nvml_status() == "ok", reason="this machine has an NVIDIA driver")
def test_recommend_without_driver_on_a_machine_without_one(cli):
    result = cli("compat", "recommend")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no NVIDIA driver found" in result.stderr and "pass --driver" in result.stderr


@pytest.mark.gpu
def test_recommend_reads_this_machines_driver_and_gpus(cli):
    from gptforge.probe.nvml import probe_nvml

    info = probe_nvml()
    given = ["--driver", info["driver_version"]] + [a for g in info["gpus"] for a in ("--cc", g["compute_capability"])]
    here = json.loads(cli("compat", "recommend", "--json").stdout)
    assert here == json.loads(cli("compat", "recommend", *given, "--json").stdout)


def test_help_explains(cli):
    result = cli("compat", "check", "--help")
    assert result.returncode == 0
    for flag in ("--driver", "--gpu", "--cc", "--cuda", "--torch", "--torch-cuda", "--python", "--gcc", "--cudnn",
                 "--json"):
        assert flag in result.stdout


WHEEL = "flash_attn-2.5.5+cu118torch2.2cxx11abiTRUE-cp38-cp38-linux_x86_64.whl"


def test_a_table_written_to_a_pipe_keeps_each_row_on_one_line(cli):
    """Read through a pipe (grep, less, a CI log), a table must not fold a wheel name over two lines."""
    result = cli("compat", "check", "--torch", "2.2.0+cu118", "--wheel", WHEEL)
    assert result.returncode == 1
    (row,) = [line for line in result.stdout.splitlines() if "wheel-abi-mismatch" in line]
    assert WHEEL in row and "cxx11abiFALSE" in row  # the problem and the fix on the row's one line
    recommend = cli("compat", "recommend", "--driver", "535.104.05", "--cc", "9.0")
    assert any("cuda-12-6" in line and "minor-version compatibility" in line for line in recommend.stdout.splitlines())


@pytest.mark.parametrize("environment,python", [("cpu", "3.11"), ("cuda-13-0", "3.12"), ("hopper", "3.12")])
def test_without_pixi_the_line_makes_the_venv_its_wheels_need(environment, python):
    """The hashed exports hold wheels for one Python (cp311 / cp312): the line starts with that venv."""
    from gptforge.compat.project_envs import environments

    (env,) = [e for e in environments() if e.name == environment]
    assert env.venv.startswith(f"python{python} -m venv .venv && . .venv/bin/activate && pip install --require-hashes "
                               f"-r envs/{environment}/requirements.txt"), env.venv


def test_recommend_prints_the_venv_line(cli):
    report = json.loads(cli("compat", "recommend", "--driver", "580.65.06", "--gpu", "H100", "--json").stdout)
    assert report["venv"].startswith("python3.12 -m venv .venv && ")


DOC_COMMAND = re.compile(r"^\$ (gptforge compat check .*?)(?:\s+# exit status (\d+))?$")


def doc_examples() -> list[tuple[str, int, list[str]]]:
    """Each `$ gptforge compat check ...` of docs/compat.md with the output shown under it."""
    examples, lines = [], (Path(__file__).resolve().parents[1] / "docs" / "compat.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("$ gptforge compat check"):
            continue
        command = line
        j = i + 1
        while command.split("#")[0].rstrip().endswith("\\"):
            command = command.split("#")[0].rstrip()[:-1] + " " + lines[j].strip()
            j += 1
        output = []
        while j < len(lines) and lines[j] != "```" and not lines[j].startswith("$ "):
            output.append(lines[j])
            j += 1
        found = DOC_COMMAND.match(command)
        examples.append((found[1], int(found[2] or 0), output))
    return examples


@pytest.mark.parametrize("command,status,shown", doc_examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_docs_show_the_real_output(cli, command, status, shown):
    result = cli(*shlex.split(command)[1:])
    assert result.returncode == status, result.stderr
    real = [line.rstrip() for line in (result.stdout + result.stderr).splitlines()]
    assert [line.rstrip() for line in shown] == real
