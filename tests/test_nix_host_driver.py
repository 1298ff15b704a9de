"""nix/host-driver.sh, the host-side discovery of the NVIDIA driver files the nix shell binds, run on
fake driver directories."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "nix" / "host-driver.sh"
DEST = "/.host-driver"
BASH = shutil.which("bash")


def host_driver(*dirs: Path, path: Path, override: Path | None = None) -> subprocess.CompletedProcess:
    # PATH holds only the test's own bin directory: the script needs no external command, and a
    # real nvidia-smi on the machine running the tests must not leak in.
    env = {"PATH": str(path)}
    if override is not None:
        env["GPTFORGE_DRIVER_DIR"] = str(override)
    return subprocess.run([BASH, str(SCRIPT), DEST, *map(str, dirs)], capture_output=True, text=True, env=env,
                          timeout=60)


def binds(proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    pairs = [line.split("\t") for line in proc.stdout.splitlines()]
    assert all(len(p) == 2 for p in pairs), proc.stdout
    return {dest: src for src, dest in pairs}


def fake_driver(root: Path, version: str = "550.54.15") -> Path:
    """A distribution's library directory: the driver's files beside everything else."""
    root.mkdir(parents=True)
    for name in (f"libcuda.so.{version}", f"libnvidia-ml.so.{version}", f"libnvidia-ptxjitcompiler.so.{version}",
                 f"libcudadebugger.so.{version}", "libstdc++.so.6.0.30", "libcudart.so.12.0.146", "libc.so.6",
                 "libz.so.1"):
        (root / name).write_bytes(b"\x7fELF")
    for link, target in (("libcuda.so.1", f"libcuda.so.{version}"), ("libcuda.so", "libcuda.so.1"),
                         ("libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"),
                         ("libstdc++.so.6", "libstdc++.so.6.0.30"), ("libcudart.so.12", "libcudart.so.12.0.146")):
        (root / link).symlink_to(target)
    return root


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    return path


def add_nvidia_smi(bin_dir: Path) -> Path:
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    return smi


def test_found_binds_the_driver_files_of_the_first_directory_holding_libcuda(tmp_path, bin_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    first = fake_driver(tmp_path / "lib-a")
    fake_driver(tmp_path / "lib-b", version="580.95.05")
    found = binds(host_driver(empty, first, tmp_path / "lib-b", path=bin_dir))
    assert found == {
        f"{DEST}/lib/{name}": str(first / name)
        for name in ("libcuda.so", "libcuda.so.1", "libcuda.so.550.54.15", "libcudadebugger.so.550.54.15",
                     "libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15", "libnvidia-ptxjitcompiler.so.550.54.15")
    }


def test_the_libraries_beside_libcuda_are_never_bound(tmp_path, bin_dir):
    lib = fake_driver(tmp_path / "lib")
    sources = {Path(src).name for src in binds(host_driver(lib, path=bin_dir)).values()}
    assert sources, "the fake driver was not found"
    assert not {n for n in sources if n.startswith(("libstdc++", "libcudart", "libc.", "libz"))}


def test_dangling_driver_symlink_is_skipped(tmp_path, bin_dir):
    lib = fake_driver(tmp_path / "lib")
    (lib / "libnvidia-gone.so").symlink_to("libnvidia-gone.so.1")
    assert f"{DEST}/lib/libnvidia-gone.so" not in binds(host_driver(lib, path=bin_dir))


def test_nvidia_smi_on_path_is_bound_for_pixi(tmp_path, bin_dir):
    lib = fake_driver(tmp_path / "lib")
    smi = add_nvidia_smi(bin_dir)
    assert binds(host_driver(lib, path=bin_dir))[f"{DEST}/bin/nvidia-smi"] == str(smi)


def test_not_found_binds_nothing_and_says_how_to_point_at_the_driver(tmp_path, bin_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "libnvidia-ml.so.1").write_bytes(b"\x7fELF")  # no libcuda.so.1: not a driver directory
    proc = host_driver(empty, tmp_path / "missing", path=bin_dir)
    assert (proc.returncode, proc.stdout) == (0, "")
    assert len(proc.stderr.splitlines()) == 1
    assert "GPTFORGE_DRIVER_DIR" in proc.stderr and "CONDA_OVERRIDE_CUDA" in proc.stderr


def test_override_is_the_only_directory_searched(tmp_path, bin_dir):
    usual = fake_driver(tmp_path / "usual")
    odd = fake_driver(tmp_path / "opt" / "nvidia" / "lib", version="580.95.05")
    found = binds(host_driver(usual, path=bin_dir, override=odd))
    assert found[f"{DEST}/lib/libcuda.so.1"] == str(odd / "libcuda.so.1")
    assert all(Path(src).parent == odd for src in found.values())


def test_override_without_libcuda_is_an_error(tmp_path, bin_dir):
    usual = fake_driver(tmp_path / "usual")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    proc = host_driver(usual, path=bin_dir, override=wrong)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"GPTFORGE_DRIVER_DIR={wrong}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_destination_is_a_usage_error(bin_dir):
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, env={"PATH": str(bin_dir)},
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "usage: host-driver.sh DEST" in proc.stderr


def test_default_directories_are_used_without_arguments(tmp_path, bin_dir):
    # Nothing to fake at /run or /usr; the run must simply not fail, whatever this machine has.
    proc = subprocess.run([BASH, str(SCRIPT), DEST], capture_output=True, text=True, env={"PATH": str(bin_dir)},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert all(line.split("\t")[1].startswith(f"{DEST}/") for line in proc.stdout.splitlines())
    assert all(os.path.exists(line.split("\t")[0]) for line in proc.stdout.splitlines())
