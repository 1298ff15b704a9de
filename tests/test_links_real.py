"""The real CUDA runtime: the toolkit's libcudart copied into a prefix next to a real decoy of
another major (libcudart 12.8 from NVIDIA's nvidia-cuda-runtime-cu12 wheel). Before the repair
ctypes loads the decoy through libcudart.so; after it, the toolkit's runtime, with its real version."""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import pytest

from conftest import run_cli, snapshot, symlink, toolkit_cudart
from gptforge.links.elf import read_soname
from gptforge.links.libversion import load_versions

DECOY_WHEEL = "nvidia-cuda-runtime-cu12==12.8.90"
DECOY_VERSION = (12, 8, 90)


@pytest.fixture(scope="module")
def decoy_cudart(tmp_path_factory) -> str:
    """libcudart.so.12 from the wheel named by GPTFORGE_CUDART_DECOY_WHEEL (.ci/run downloads it; the
    default suite downloads nothing)."""
    wheel = os.environ.get("GPTFORGE_CUDART_DECOY_WHEEL")
    if not wheel or not os.path.isfile(wheel):
        pytest.skip(f"set GPTFORGE_CUDART_DECOY_WHEEL to the {DECOY_WHEEL} wheel (.ci/run downloads it: pip download "
                    f"--no-deps --only-binary=:all: --platform manylinux2014_x86_64 {DECOY_WHEEL})")
    out = os.path.join(str(tmp_path_factory.mktemp("links-decoy-lib")), "libcudart.so.12")
    with zipfile.ZipFile(wheel) as z, z.open("nvidia/cuda_runtime/lib/libcudart.so.12") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def test_decoy_loaded_before_and_real_runtime_after(tmp_path, decoy_cudart):
    real, number = toolkit_cudart()
    major, minor = number // 1000, number % 1000 // 10
    cuda = f"{major}.{minor}"
    assert read_soname(real) == f"libcudart.so.{major}"
    assert read_soname(decoy_cudart) == "libcudart.so.12"

    prefix = tmp_path / "env"
    target_lib = prefix / "targets" / "x86_64-linux" / "lib"
    target_lib.mkdir(parents=True)
    name = os.path.basename(real)
    if name.count(".") < 4:  # a toolkit that names the file by SONAME only: name it by its real version
        name = f"libcudart.so.{major}.{minor}.0"
    shutil.copyfile(real, target_lib / name)
    lib = prefix / "lib"
    lib.mkdir()
    decoy_name = "libcudart.so." + ".".join(map(str, DECOY_VERSION))
    shutil.copyfile(decoy_cudart, lib / decoy_name)
    symlink(decoy_name, str(lib / "libcudart.so"))  # what a stray package left behind
    symlink(f"../targets/x86_64-linux/lib/{name}", str(lib / name))
    symlink(decoy_name, str(lib / "libcudart.so.12"))
    before = snapshot(str(prefix))

    assert load_versions([str(lib / "libcudart.so")])[0].version == 12080, "before the fix: the decoy"

    out = run_cli("fix-links", "--prefix", str(prefix), "--cuda", cuda, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["chosen"]["libcudart"]["file"] == f"targets/x86_64-linux/lib/{name}"
    assert {v["path"]: v["runtime_version"] for v in report["verified"]} == {
        "lib/libcudart.so": number, f"lib/libcudart.so.{major}": number}

    versions = load_versions([str(lib / "libcudart.so"), str(lib / f"libcudart.so.{major}"), str(lib / "libcudart.so.12")])
    assert [v.version for v in versions] == [number, number, 12080], "after: the real runtime; the 12 SONAME untouched"

    undo = run_cli("fix-links", "--prefix", str(prefix), "--undo")
    assert undo.returncode == 0
    assert snapshot(str(prefix)) == before
    assert load_versions([str(lib / "libcudart.so")])[0].version == 12080


def test_mislabeled_runtime_fails_verification(tmp_path, decoy_cudart):
    """A 12.8 runtime wearing a 13.0 file name (and a matching SONAME link) is caught by the
    proof step, not trusted: exit 1 and links-verify-failed."""
    prefix = tmp_path / "env"
    lib = prefix / "lib"
    lib.mkdir(parents=True)
    shutil.copyfile(decoy_cudart, lib / "libcudart.so.12.6.0")  # really 12.8
    out = run_cli("fix-links", "--prefix", str(prefix), "--cuda", "12.6", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1
    assert [f["code"] for f in report["findings"]] == ["links-verify-failed", "links-verify-failed"]
    assert {v["runtime_version"] for v in report["verified"]} == {12080}
