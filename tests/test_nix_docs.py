"""A Nix installed with its defaults has flakes off, and `nix develop` then stops at once ("experimental Nix
feature 'nix-command' is disabled"): README and docs/nix.md say how to turn them on, and what they say works."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF_LINE = "experimental-features = nix-command flakes"
FLAG = "--extra-experimental-features 'nix-command flakes'"


@pytest.mark.parametrize("doc", ["README.md", "docs/nix.md"])
def test_the_docs_say_how_to_turn_flakes_on(doc):
    text = (REPO / doc).read_text()
    assert CONF_LINE in text and f"nix {FLAG} develop" in text


# Nix itself: .ci/run installs Debian's nix-bin; a machine without Nix has nothing to run these commands with
@pytest.mark.skipif(shutil.which("nix") is None, reason="Nix is not installed (Debian: apt-get install nix-bin; .ci/run installs it)")
def test_what_the_docs_say_turns_flakes_on(tmp_path):
    for name in ("flake.nix", "flake.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    metadata = ["flake", "metadata", "--offline", "--no-update-lock-file", f"path:{tmp_path}"]
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}  # no user nix.conf

    def nix(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["nix", *args], capture_output=True, text=True, env={**env, **extra}, timeout=120)

    default = nix(*metadata)
    if default.returncode == 0:
        pytest.skip("this machine's /etc/nix/nix.conf turns flakes on already")  # nothing left to show
    assert "experimental Nix feature 'nix-command' is disabled" in default.stderr
    user_conf = tmp_path / "config" / "nix" / "nix.conf"  # where docs/nix.md puts the line
    user_conf.parent.mkdir(parents=True)
    user_conf.write_text(CONF_LINE + "\n")
    assert nix(*metadata).returncode == 0
    user_conf.unlink()
    assert nix(*shlex.split(FLAG), *metadata).returncode == 0
