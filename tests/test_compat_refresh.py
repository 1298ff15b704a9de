"""The tables the refresh script owns: made offline from recorded inputs, every row with its source,
and the hand-entered torch facts checked against them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from compatgen import refresh, torch_wheels
from gptforge.compat.facts import facts
from gptforge.core.versions import parse_cuda


def _generated(path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_conda_builds_table_equals_the_refresh_output_of_its_recorded_input():
    text = refresh.CONDA_INPUT.read_text(encoding="utf-8")
    assert refresh.CONDA_OUTPUT.read_text(encoding="utf-8") == refresh.conda_builds_table(text)


def test_every_generated_row_names_its_source():
    python_rows = _generated(refresh.OUTPUT)["wheel"]
    assert all(row["source"] == f"https://pypi.org/project/torch/{row['version']}/#files" for row in python_rows)
    builds = _generated(refresh.CONDA_OUTPUT)["build"]
    assert len(builds) > 50
    assert all(row["source"].startswith("https://github.com/moi90/pytorch_compute_capabilities/blob/") and
               row["source"].endswith("/table.md") and "/blob/main/" not in row["source"] for row in builds)


def test_conda_rows_are_read_from_the_package_names_and_cuobjdump_lists():
    text = ("<!-- recorded from https://example.org/blob/0123/table.md -->\n"
            "| pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0    | sm_50, sm_90, sm_90a |\n"
            "| pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0    | sm_50, sm_90, sm_90a |\n"
            "| pytorch-1.7.1-py3.9_cuda11.0.221_cudnn8.0.5_0 | sm_35, sm_80         |\n")
    rows = tomllib.loads(refresh.conda_builds_table(text))["build"]
    assert rows[0] == {"torch": "2.5.1", "cuda": "12.4", "cudnn": "9.1.0", "arches": "5.0 9.0 9.0a",
                       "packages": ["pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0",
                                    "pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0"],
                       "source": "https://example.org/blob/0123/table.md"}
    assert (rows[1]["cuda"], rows[1]["arches"]) == ("11.0", "3.5 8.0")


def test_hand_entered_cudnn_per_torch_build_agrees_with_the_packages():
    """torch.toml's bundled cuDNN per (release, CUDA) is the cuDNN the same release's packages carry."""
    builds = _generated(refresh.CONDA_OUTPUT)["build"]
    by_build: dict[tuple[str, str], set[str]] = {}
    for row in builds:
        release = ".".join(row["torch"].split(".")[:2])
        by_build.setdefault((release, row["cuda"]), set()).add(row["cudnn"])
    compared = 0
    for release, entry in facts().torch.items():
        for variant in entry.variants:
            packaged = by_build.get((release, str(variant.cuda.release)))
            if variant.cudnn is None or not packaged:
                continue
            compared += 1
            assert Version(".".join(str(p) for p in variant.cudnn.release[:3])) in {Version(c) for c in packaged}, \
                (release, variant.cuda, variant.cudnn, packaged)
    assert compared >= 15


def test_every_gpu_row_names_the_page_or_report_it_was_read_from():
    from gptforge.compat.facts import load_table

    rows = load_table("gpus.toml")["gpu"]
    nvidia = {"https://developer.nvidia.com/cuda-gpus", "https://developer.nvidia.com/cuda-legacy-gpus"}
    assert all(row["source"] in nvidia or row["source"].startswith("https://github.com/") for row in rows)
    assert not [row for row in rows if "third-party" in row.get("note", "") or "unverified" in row.get("note", "")]


def test_pypi_builds_table_equals_the_refresh_output_of_its_recorded_input():
    text = refresh.REQUIRES_INPUT.read_text(encoding="utf-8")
    assert refresh.REQUIRES_OUTPUT.read_text(encoding="utf-8") == refresh.pypi_builds_table(text)
    rows = _generated(refresh.REQUIRES_OUTPUT)["wheel"]
    assert len(rows) > 20
    assert all(row["source"].startswith("https://files.pythonhosted.org/") and row["source"].endswith(".whl.metadata")
               and row["source"].rsplit("/", 1)[1] == row["wheel"] + ".metadata" for row in rows)


def test_pypi_rows_are_read_from_the_wheels_requires_dist():
    url = "https://files.pythonhosted.org/packages/x/{}"
    text = "\n".join([
        "# comment",
        f"torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl\t{url.format('a')}\tnvidia-cuda-runtime-cu12==12.4.127; "
        'platform_system == "Linux" and platform_machine == "x86_64"',
        f"torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl\t{url.format('a')}\tnvidia-cudnn-cu12==9.1.0.70",
        f"torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl\t{url.format('a')}\tnvidia-nccl-cu12==2.21.5",
        f"torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl\t{url.format('a')}\tnvidia-cublas-cu12==12.4.5.8",
        f"torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl\t{url.format('b')}\t"
        'cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"',
        f"torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl\t{url.format('b')}\tnvidia-cudnn-cu13==9.20.0.48",
        f"torch-1.12.0-cp310-cp310-manylinux1_x86_64.whl\t{url.format('c')}\tnvidia-dali>=1",  # no CUDA pin: no row
    ])
    rows = tomllib.loads(refresh.pypi_builds_table(text))["wheel"]
    assert rows == [
        {"version": "2.5.1", "cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5",
         "wheel": "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl", "source": url.format("a") + ".metadata"},
        {"version": "2.13.0", "cuda": "13.0", "cudnn": "9.20.0.48",
         "wheel": "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "source": url.format("b") + ".metadata"},
    ]


def _pins() -> dict[tuple[str, str], dict[str, set[str]]]:
    pins: dict[tuple[str, str], dict[str, set[str]]] = {}
    for row in _generated(refresh.REQUIRES_OUTPUT)["wheel"]:
        found = pins.setdefault((".".join(row["version"].split(".")[:2]), row["cuda"]), {"cudnn": set(), "nccl": set()})
        for key in ("cudnn", "nccl"):
            found[key] |= {row[key]} if key in row else set()
    return pins


def test_pypi_variants_carry_the_cudnn_and_nccl_their_wheels_pin():
    """torch.toml's hand-entered cuDNN / NCCL of a PyPI build equal the pins of that build's wheels, and
    where torch.toml leaves them out the engine takes the wheels' pins."""
    pins, compared = _pins(), 0
    for release, entry in facts().torch.items():
        for variant in entry.variants:
            pinned = pins.get((release, str(variant.cuda.release)))
            if variant.channel != "pypi" or pinned is None:
                continue
            for key in ("cudnn", "nccl"):
                if len(pinned[key]) == 1:
                    compared += 1
                    assert str(getattr(variant, key)) in pinned[key], (release, variant.cuda, key, pinned[key])
    assert compared > 20
    assert str(facts().torch["2.5"].variant(parse_cuda("12.4")).nccl) == "2.21.5"  # not in torch.toml: from the pins


def test_measured_wheels_table_equals_the_refresh_output_of_its_recorded_input():
    text = torch_wheels.INPUT.read_text(encoding="utf-8")
    assert torch_wheels.OUTPUT.read_text(encoding="utf-8") == torch_wheels.table(text)
    rows = _generated(torch_wheels.OUTPUT)["wheel"]
    assert len(rows) > 50
    assert all(row["source"].startswith("https://files.pythonhosted.org/") and
               row["source"].rsplit("/", 1)[1] == row["wheel"] and row["wheel"].startswith(f"torch-{row['version']}-")
               for row in rows)


def test_hand_entered_pypi_cuda_is_the_cuda_of_the_measured_wheels():
    """torch.toml's pypi_cuda of a release names the CUDA torch/version.py of each of its PyPI wheels names."""
    compared = 0
    for row in _generated(torch_wheels.OUTPUT)["wheel"]:
        release = facts().torch.get(".".join(row["version"].split(".")[:2]))
        if release is not None and release.pypi_cuda is not None and "cuda" in row:
            compared += 1
            assert str(release.pypi_cuda) == row["cuda"], (row["version"], release.pypi_cuda, row["cuda"])
    assert compared > 15


def test_the_arches_of_a_version_s_pypi_wheel_are_its_own_and_only_for_its_cuda():
    arches, ptx = facts().wheel_arches(Version("1.2.0"), parse_cuda("10.0"))
    assert " ".join(map(str, arches)) == "3.5 5.0 6.0 6.1 7.0 7.5" and " ".join(map(str, ptx)) == "5.0"
    assert facts().wheel_arches(Version("1.2.0"), parse_cuda("9.2")) is None  # the cu92 build is not PyPI's wheel
    assert facts().wheel_arches(Version("1.2.0+cu100"), parse_cuda("10.0")) == (arches, ptx)


def _installed_nvcc() -> Path | None:
    """The nvcc torch's cpp_extension would find: on PATH, under CUDA_HOME, or /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME")
    for candidate in (shutil.which("nvcc"), home and Path(home, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.mark.skipif(_installed_nvcc() is None, reason="no CUDA toolkit on this machine")
def test_the_arch_table_lists_what_the_installed_nvcc_targets():
    nvcc = str(_installed_nvcc())
    release = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                                                check=True).stdout).group(1)
    listed = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=False)
    table = facts().targetable(parse_cuda(release))
    if listed.returncode != 0 or table is None:
        pytest.skip(f"nvcc {release} lists no codes, or the table has no row for it")
    codes = {f"{int(n) // 10}.{int(n) % 10}" for n in re.findall(r"\bsm_(\d+)\b", listed.stdout)}
    assert {str(arch) for arch in table if not arch.suffix} == codes
