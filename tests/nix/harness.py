"""Offline checks of flake.nix with Nix alone: nothing is fetched or built.

    python tests/nix/harness.py [REPO]

Parses the Nix files, checks flake.lock against the verified nixpkgs pin and reads it without
updating it, evaluates the flake's outputs against the stand-in nixpkgs (tests/nix/stand-in),
runs `nix flake show` and `nix flake check --no-build` on them, counts the assertions of
assertions.nix and checks that the flake's pixi satisfies pixi.toml's requires-pixi. Prints one line
per check and `N passed, N failed`; exits 0 when nothing failed, 1 otherwise, 2 without Nix.

The flake is evaluated from a copy holding only flake.nix, flake.lock and nix/: a `path:` flake is
copied whole into the Nix store, and a repository's virtual environment has no business there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# >>> The pixi version range the flake must satisfy when the repository has no pixi.toml.
# >>> With a pixi.toml, its [workspace] requires-pixi is used instead; keep the two equal.
REQUIRES_PIXI_FALLBACK = ">=0.77.0,<0.78"

SYSTEM = "x86_64-linux"
FLAKE_FILES = ("flake.nix", "flake.lock", "nix")
NIX_FLAGS = [
    "--extra-experimental-features", "nix-command flakes",
    "--offline",
    "--option", "substituters", "",
]
OUTPUTS = (
    f"devShells.{SYSTEM}.default",
    f"packages.{SYSTEM}.default",
    f"packages.{SYSTEM}.gptforge-shell",
    f"packages.{SYSTEM}.pixi",
)
TIMEOUT_S = 300


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    passed: int = 0
    failed: int = 0

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        if ok:
            self.passed += 1
            self.lines.append(f"ok   {name}")
        else:
            self.failed += 1
            self.lines.append(f"FAIL {name}" + (f": {detail}" if detail else ""))
        print(self.lines[-1], flush=True)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def nix_error(proc: subprocess.CompletedProcess) -> str:
    """The error lines of a failed Nix command, without its warnings and traces."""
    errors = [line.strip() for line in proc.stderr.splitlines() if line.startswith("error")]
    return " | ".join(errors)[:400] or proc.stderr.strip()[-400:] or f"exit status {proc.returncode}"


def stage(repo: Path, into: Path) -> Path:
    flake = into / "flake"
    flake.mkdir()
    for name in FLAKE_FILES:
        source = repo / name
        if source.is_dir():
            shutil.copytree(source, flake / name)
        elif source.exists():
            shutil.copy2(source, flake / name)
    return flake


def check_parse(report: Report, repo: Path, flake: Path) -> None:
    files = [flake / "flake.nix", *sorted((flake / "nix").glob("*.nix")),
             *sorted((repo / "tests" / "nix").rglob("*.nix"))]
    for path in files:
        proc = run(["nix-instantiate", "--parse", str(path)])
        report.add(f"parse {path.relative_to(flake if path.is_relative_to(flake) else repo)}",
                   proc.returncode == 0, nix_error(proc))
    for script in sorted((flake / "nix").glob("*.sh")):
        proc = run(["bash", "-n", str(script)])
        report.add(f"parse nix/{script.name}", proc.returncode == 0, proc.stderr.strip())


def check_lock(report: Report, repo: Path, flake: Path) -> None:
    proc = run(["nix", *NIX_FLAGS, "flake", "metadata", "--no-update-lock-file", "--json", f"path:{flake}"])
    report.add("flake.lock is current for flake.nix (nix flake metadata --offline --no-update-lock-file)",
               proc.returncode == 0, nix_error(proc))

    pin = tomllib.loads((repo / "tests" / "nix" / "nixpkgs-pin.toml").read_text())
    try:
        node = json.loads((flake / "flake.lock").read_text())["nodes"]["nixpkgs"]
    except (OSError, ValueError, KeyError) as exc:
        report.add("flake.lock holds the verified nixpkgs pin", False, f"no nixpkgs node in flake.lock: {exc}")
        return
    for part in ("locked", "original"):
        differing = sorted(k for k in pin[part].keys() | node.get(part, {}).keys()
                           if pin[part].get(k) != node.get(part, {}).get(k))
        report.add(f"flake.lock {part} is the verified nixpkgs pin (tests/nix/nixpkgs-pin.toml)", not differing,
                   "differs in " + ", ".join(f"{k}={node.get(part, {}).get(k)!r}" for k in differing))

    tarball = pin["fetch-tarball"]["sha256"]
    proc = run(["nix", *NIX_FLAGS, "hash", "to-sri", "--type", "sha256", tarball])
    report.add("the pin's narHash is the independently recorded fetchTarball sha256 (nix hash to-sri)",
               proc.returncode == 0 and proc.stdout.strip() == pin["locked"]["narHash"],
               nix_error(proc) if proc.returncode else f"{tarball} is {proc.stdout.strip()}")


def nix_with_stand_in(repo: Path, flake: Path, *args: str) -> subprocess.CompletedProcess:
    override = ["--no-write-lock-file", "--override-input", "nixpkgs", f"path:{repo / 'tests' / 'nix' / 'stand-in'}"]
    return run(["nix", *NIX_FLAGS, *args[:-1], *override, args[-1]])


def check_evaluation(report: Report, repo: Path, flake: Path) -> None:
    for output in OUTPUTS:
        proc = nix_with_stand_in(repo, flake, "eval", "--raw", f"path:{flake}#{output}.drvPath")
        ok = proc.returncode == 0 and proc.stdout.startswith("/nix/store/") and proc.stdout.endswith(".drv")
        report.add(f"{output}.drvPath evaluates", ok, nix_error(proc))

    proc = nix_with_stand_in(repo, flake, "flake", "show", "--json", f"path:{flake}")
    shown = json.loads(proc.stdout) if proc.returncode == 0 else {}
    missing = [o for o in OUTPUTS if not _has(shown, o.split("."))]
    report.add("nix flake show lists the dev shell and the packages", proc.returncode == 0 and not missing,
               nix_error(proc) if proc.returncode else f"missing {', '.join(missing)}")

    proc = nix_with_stand_in(repo, flake, "flake", "check", "--no-build", f"path:{flake}")
    report.add("nix flake check --no-build", proc.returncode == 0, nix_error(proc))


def _has(tree: dict, keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def check_assertions(report: Report, repo: Path, flake: Path) -> None:
    proc = run(["nix-instantiate", "--eval", "--strict", "--json",
                str(repo / "tests" / "nix" / "assertions.nix"), "--argstr", "flakeDir", str(flake)])
    if proc.returncode != 0:
        report.add("assertions.nix evaluates", False, nix_error(proc))
        return
    for assertion in json.loads(proc.stdout):
        report.add(assertion["name"], assertion["ok"] is True)


def requires_pixi(repo: Path) -> tuple[str, str]:
    """pixi.toml's requires-pixi and where it came from, or the fallback above."""
    manifest = repo / "pixi.toml"
    if not manifest.exists():
        return REQUIRES_PIXI_FALLBACK, "tests/nix/harness.py REQUIRES_PIXI_FALLBACK"
    data = tomllib.loads(manifest.read_text())
    table = data.get("workspace") or data.get("project") or {}
    if "requires-pixi" not in table:
        return REQUIRES_PIXI_FALLBACK, "tests/nix/harness.py REQUIRES_PIXI_FALLBACK (pixi.toml sets none)"
    return table["requires-pixi"], "pixi.toml"


def check_pixi_version(report: Report, repo: Path, flake: Path) -> None:
    name = "the flake's pixi satisfies requires-pixi"
    proc = nix_with_stand_in(repo, flake, "eval", "--raw", f"path:{flake}#packages.{SYSTEM}.pixi.version")
    if proc.returncode != 0:
        report.add(name, False, nix_error(proc))
        return
    spec, origin = requires_pixi(repo)
    try:
        ok = Version(proc.stdout) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion) as exc:
        report.add(name, False, f"cannot compare pixi {proc.stdout!r} with {spec!r} from {origin}: {exc}")
        return
    report.add(f"{name} ({proc.stdout} in {spec!r} from {origin})", ok,
               "" if ok else "bump nix/pixi-release.toml to a release inside that range, with its published sha256")


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        print("usage: python tests/nix/harness.py [REPO]", file=sys.stderr)
        return 2
    repo = Path(argv[1]).resolve() if len(argv) == 2 else Path(__file__).resolve().parents[2]
    missing = [tool for tool in ("nix", "nix-instantiate", "bash") if shutil.which(tool) is None]
    if missing:
        print(f"cannot run: {', '.join(missing)} not found (Debian: apt-get install nix-bin)", file=sys.stderr)
        return 2
    if not (repo / "flake.nix").exists():
        print(f"cannot run: {repo} has no flake.nix", file=sys.stderr)
        return 2

    report = Report()
    with tempfile.TemporaryDirectory(prefix="gptforge-flake-") as tmp:
        flake = stage(repo, Path(tmp))
        for check in (check_parse, check_lock, check_evaluation, check_assertions, check_pixi_version):
            check(report, repo, flake)
    print(f"{report.passed} passed, {report.failed} failed")
    return 0 if report.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
