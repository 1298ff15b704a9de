"""`gptforge doctor` on a GPU machine: what it reports must equal what the driver, nvidia-smi and torch say."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import codes, doctor_json

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def report():
    return doctor_json()


def test_driver_and_gpus_match_nvidia_smi(report):
    _, data = report
    driver = data["machine"]["driver"]
    assert driver["status"] == "ok", driver["error"]
    assert driver["gpus"], "a GPU machine with no GPU visible"
    assert "no-gpu" not in codes(data)
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not on PATH")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    assert len(driver["gpus"]) == len(smi)
    for gpu, line in zip(driver["gpus"], smi):
        version, name, cc = (part.strip() for part in line.split(","))
        assert (driver["driver_version"], gpu["name"], gpu["compute_capability"]) == (version, name, cc)


def test_torch_sees_the_gpus_doctor_reports(report):
    torch = pytest.importorskip("torch")
    _, data = report
    m = data["machine"]
    assert m["torch"]["cuda"] == torch.version.cuda and m["torch"]["cuda_available"] is True
    by_uuid = {gpu["uuid"]: gpu for gpu in m["driver"]["gpus"]}  # NVML numbers every GPU; torch the visible ones
    for index in range(torch.cuda.device_count()):
        gpu = by_uuid[f"GPU-{torch.cuda.get_device_properties(index).uuid}"]
        major, minor = torch.cuda.get_device_capability(index)
        assert gpu["compute_capability"] == f"{major}.{minor}"


def test_loaded_libcudart_is_torch_runtime(report):
    _, data = report
    m = data["machine"]
    loaded = m["libcudart_loaded"]
    assert loaded, "a CUDA build of torch maps libcudart when imported"
    want = ".".join(m["torch"]["cuda"].split(".")[:2])
    assert all(lib["version"] == want for lib in loaded), loaded
    assert len({lib["real_path"] for lib in loaded}) == 1, "one CUDA runtime per process"
    assert all(os.path.isfile(lib["real_path"]) for lib in loaded)
    assert not codes(data) & {"libcudart-version-mismatch", "libcudart-multiple"}


def test_fp8_verdict_follows_compute_capability(report):
    _, data = report
    ccs = [tuple(map(int, g["compute_capability"].split("."))) for g in data["machine"]["driver"]["gpus"]]
    if any(cc >= (9, 0) for cc in ccs):  # Hopper and newer: FP8 always (Ada also needs CUDA >= 12.1)
        assert data["machine"]["transformer_engine"]["fp8_usable"] is True
    if all(cc < (8, 9) for cc in ccs):
        assert data["machine"]["transformer_engine"]["fp8_usable"] is False
