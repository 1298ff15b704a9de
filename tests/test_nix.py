"""flake.nix, checked offline by tests/nix/harness.py: the harness passes on the repository, and
each kind of breakage it exists for, made on a temporary copy, makes it fail."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "nix" / "harness.py"
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$", re.MULTILINE)
NIX_FLAGS = ["--extra-experimental-features", "nix-command flakes", "--offline", "--option", "substituters", ""]

pytestmark = pytest.mark.skipif(
    shutil.which("nix") is None or shutil.which("nix-instantiate") is None,
    reason="Nix is not installed (Debian: apt-get install nix-bin; .ci/run installs it)",
)


def run_harness(repo: Path) -> tuple[int, str, int, int]:
    proc = subprocess.run([sys.executable, str(HARNESS), str(repo)], capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    found = SUMMARY.search(proc.stdout)
    assert found, f"the harness printed no `N passed, N failed` line:\n{output}"
    return proc.returncode, output, int(found[1]), int(found[2])


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The files the harness reads, copied: flake, its nix/ directory, the harness's data, pixi.toml."""
    repo = tmp_path / "repo"
    for name in ("flake.nix", "flake.lock", "pixi.toml"):
        if (REPO / name).exists():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    shutil.copytree(REPO / "nix", repo / "nix")
    shutil.copytree(REPO / "tests" / "nix", repo / "tests" / "nix")
    return repo


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path.name}: the test must follow the file"
    path.write_text(text.replace(old, new, 1))


def failures(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAIL ")]


def test_harness_passes_on_the_repository():
    code, output, passed, failed = run_harness(REPO)
    print(output)
    assert (code, failed) == (0, 0), output
    assert passed >= 30


def test_unchanged_copy_passes(copy):
    code, output, _, failed = run_harness(copy)
    assert (code, failed) == (0, 0), output


def test_misspelt_buildfhsenv_argument_fails(copy):
    edit(copy / "flake.nix", "extraBwrapArgs =", "extraBwrapArg =")
    code, output, _, failed = run_harness(copy)
    assert code == 1 and failed > 0, output
    assert any("no argument named extraBwrapArg" in line for line in failures(output)), output


def test_changed_nar_hash_in_the_lock_fails(copy):
    lock = json.loads((copy / "flake.lock").read_text())
    nar_hash = lock["nodes"]["nixpkgs"]["locked"]["narHash"]
    # still a well-formed SRI hash, only not the pinned one
    flipped = nar_hash[:10] + ("A" if nar_hash[10] != "A" else "B") + nar_hash[11:]
    edit(copy / "flake.lock", nar_hash, flipped)
    code, output, _, failed = run_harness(copy)
    assert code == 1 and failed > 0, output
    assert any("narHash" in line for line in failures(output)), output


def test_input_url_that_the_lock_does_not_match_fails(copy):
    edit(copy / "flake.nix", "github:NixOS/nixpkgs/nixos-25.11", "github:NixOS/nixpkgs/nixos-unstable")
    code, output, _, _ = run_harness(copy)
    assert code == 1, output
    assert any("nix flake metadata" in line for line in failures(output)), output


def test_host_usr_lib_on_ld_library_path_fails(copy):
    edit(copy / "flake.nix", "export LD_LIBRARY_PATH=/run/opengl-driver/lib:",
         "export LD_LIBRARY_PATH=/run/opengl-driver/lib:/usr/lib:")
    code, output, _, _ = run_harness(copy)
    assert code == 1, output
    assert any("nothing from /usr" in line for line in failures(output)), output


def test_pixi_outside_requires_pixi_fails(copy):
    (copy / "pixi.toml").write_text('[workspace]\nname = "x"\nrequires-pixi = ">=0.78.0,<0.79"\n')
    code, output, _, _ = run_harness(copy)
    assert code == 1, output
    assert any("requires-pixi" in line and "0.77.0" in line for line in failures(output)), output


def test_wrong_pixi_hash_is_rejected_by_nix(copy):
    edit(copy / "nix" / "pixi-release.toml", 'sha256 = "bff2', 'sha256 = "zzz2')
    code, output, _, _ = run_harness(copy)
    assert code == 1, output
    assert any("pixi.drvPath" in line for line in failures(output)), output


def driver_binds(tmp_path: Path, driver_dir: Path) -> list[str]:
    """Run the flake's pre-bubblewrap commands as they stand (against the stand-in, whose
    runtimeShell is the host's bash) and return the bubblewrap arguments they produce."""
    stand_in = f"path:{REPO / 'tests' / 'nix' / 'stand-in'}"
    args = {}
    for name in ("extraPreBwrapCmds", "extraBwrapArgs"):
        proc = subprocess.run(
            ["nix", *NIX_FLAGS, "eval", "--json", "--no-write-lock-file", "--override-input", "nixpkgs", stand_in,
             f"path:{stage_flake(tmp_path)}#packages.x86_64-linux.gptforge-shell.args.{name}"],
            capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        args[name] = json.loads(proc.stdout)
    script = args["extraPreBwrapCmds"] + "\nbwrap_args=(\n" + "\n".join(args["extraBwrapArgs"]) + "\n)\n" \
        + "printf '%s\\n' \"${bwrap_args[@]}\"\n"
    # PATH: bash (the stand-in's runtimeShell) and no nvidia-smi
    env = {"PATH": str(tmp_path / "bin"), "GPTFORGE_DRIVER_DIR": str(driver_dir)}
    proc = subprocess.run([shutil.which("bash"), "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def stage_flake(tmp_path: Path) -> Path:
    flake = tmp_path / "flake"
    if not flake.exists():
        flake.mkdir()
        for name in ("flake.nix", "flake.lock"):
            shutil.copy2(REPO / name, flake / name)
        shutil.copytree(REPO / "nix", flake / "nix")
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "bash").symlink_to(shutil.which("bash"))
    return flake


def test_pre_bwrap_commands_bind_only_the_driver_read_only(tmp_path):
    driver = tmp_path / "driver"
    driver.mkdir()
    for name in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15", "libstdc++.so.6"):
        (driver / name).write_bytes(b"\x7fELF")
    (driver / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    binds = driver_binds(tmp_path, driver)
    triples = [binds[i:i + 3] for i in range(0, len(binds), 3)]
    assert all(t[0] == "--ro-bind" for t in triples), binds
    assert sorted((t[1], t[2]) for t in triples) == [
        (str(driver / "libcuda.so.1"), "/.host-driver/lib/libcuda.so.1"),
        (str(driver / "libcuda.so.550.54.15"), "/.host-driver/lib/libcuda.so.550.54.15"),
        (str(driver / "libnvidia-ml.so.550.54.15"), "/.host-driver/lib/libnvidia-ml.so.550.54.15"),
    ]
