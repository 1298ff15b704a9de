"""Which prefix to repair and which CUDA release its libraries must match."""

from __future__ import annotations

import glob
import os
import sys

from gptforge.errors import FileReadError, UsageError
from gptforge.links.families import Version
from gptforge.links.layout import Layout
from gptforge.links.libversion import read_versions
from gptforge.probe.nvcc import parse_nvcc_release
from gptforge.process import run_bounded, run_tool
from gptforge.reading import read_json

TORCH_TIMEOUT_S = 60  # importing torch from a cold disk; a hung interpreter is killed with its children


# Directories that are the system, not an environment: a repair there (mv /lib64 ...) breaks the machine.
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local", "/opt", "/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/bin",
                   "/sbin", "/usr/bin", "/etc", "/var", "/boot", "/home", "/root", "/srv", "/snap", "/nix")


def resolve_prefix(given: str | None, environ=os.environ, *, allow_system: bool = False) -> str:
    """--prefix, else the active conda/pixi environment (CONDA_PREFIX, then PIXI_PROJECT_ROOT)."""
    if given:
        prefix, flag = given, "--prefix"
    elif environ.get("CONDA_PREFIX"):
        prefix, flag = environ["CONDA_PREFIX"], "CONDA_PREFIX"
    elif environ.get("PIXI_PROJECT_ROOT"):
        name = environ.get("PIXI_ENVIRONMENT_NAME") or "default"
        prefix, flag = os.path.join(environ["PIXI_PROJECT_ROOT"], ".pixi", "envs", name), "PIXI_PROJECT_ROOT"
    else:
        raise UsageError("--prefix", "no environment given and none is active (CONDA_PREFIX and PIXI_PROJECT_ROOT unset)",
                         "pass --prefix DIR, or run inside the environment: pixi run fix-links")
    if not os.path.isdir(os.path.join(prefix, "lib")):
        raise UsageError(flag, f"{prefix} is not an environment prefix (it has no lib/ directory)",
                         "pass the directory that holds the environment's bin/ and lib/")
    if os.path.realpath(prefix) in SYSTEM_PREFIXES and not allow_system:
        raise UsageError(flag, f"{prefix} is a system directory, not an environment prefix; repairing it could break "
                         "the system", "pass the environment's own prefix, or add --allow-system-prefix if you mean it")
    return prefix


def parse_cuda(text, flag: str = "--cuda") -> Version:
    """(major, minor) by the compatibility engine's CUDA parser: fix-links and compat accept the same forms."""
    from gptforge.core.versions import VersionError, parse_cuda as parse

    try:
        if not isinstance(text, str):
            raise VersionError(f"{text!r} is a {type(text).__name__}, not a version string")
        version = parse(text)
    except VersionError as err:
        raise UsageError(flag, str(err), "write it as MAJOR.MINOR, e.g. --cuda 12.8") from None
    return version.major, version.minor


def expected_cuda(given: str | None, prefix: str, dry_run: bool = False) -> tuple[Version, str]:
    """(major, minor) and where it came from: --cuda, the cuda-version record, the prefix's own
    toolkit (version.json, bin/nvcc, the runtime file), or torch (not in a dry run, which runs nothing
    of the environment's python)."""
    if given is not None:
        return parse_cuda(given), "--cuda"
    for source in (_cuda_version_record, _version_json, _nvcc_release, _runtime_file):
        found = source(prefix)
        if found:
            return found
    if dry_run:
        raise UsageError("--cuda", f"{prefix} has no cuda-version record, version.json, bin/nvcc or runtime file that "
                         "tells its CUDA, and a dry run does not run the environment's python to ask torch",
                         "pass --cuda MAJOR.MINOR")
    return _torch_cuda(prefix)


def _version_json(prefix: str) -> tuple[Version, str] | None:
    """NVIDIA's toolkit installers write $CUDA_HOME/version.json: {"cuda": {"version": "13.0.2"}, ...}."""
    try:
        version = read_json(os.path.join(prefix, "version.json"), max_bytes=1 << 20)["cuda"]["version"]
        return parse_cuda(version, "version.json"), "version.json"
    except (FileReadError, KeyError, TypeError, UsageError):
        return None


def _nvcc_release(prefix: str) -> tuple[Version, str] | None:
    nvcc = os.path.join(prefix, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return None
    code, out, err = run_tool([nvcc, "--version"])
    release = parse_nvcc_release(out + err) if code == 0 else None
    return (parse_cuda(release), f"bin/nvcc --version: release {release}") if release else None


def _runtime_file(prefix: str) -> tuple[Version, str] | None:
    """The release of the prefix's libcudart, asked of the file itself; only when its real files agree."""
    layout = Layout.of(prefix)
    names = [p for d in layout.library_dirs() for p in glob.glob(os.path.join(d, "libcudart.so.*"))]
    reals = sorted({os.path.realpath(p) for p in names if os.path.isfile(p) and layout.inside(p)})
    readings = read_versions([(p, "cudaRuntimeGetVersion", "runtime") for p in reals])
    versions = {r.path: r.version[:2] for r in readings if r.version}
    if len(set(versions.values())) != 1:
        return None
    path, version = next(iter(versions.items()))
    return version, f"cudaRuntimeGetVersion of {layout.rel(path)}"


def _cuda_version_record(prefix: str) -> tuple[Version, str] | None:
    for path in sorted(glob.glob(os.path.join(prefix, "conda-meta", "cuda-version-*.json"))):
        try:
            record = read_json(path, max_bytes=1 << 20)
        except FileReadError:
            continue
        name = os.path.basename(path)
        if not isinstance(record, dict):
            raise UsageError(name, f"holds a JSON {type(record).__name__}, not a package record",
                             "reinstall the cuda-version package, or pass --cuda MAJOR.MINOR")
        return parse_cuda(record.get("version", ""), name), f"conda-meta/{name}"
    return None


def _torch_cuda(prefix: str) -> tuple[Version, str]:
    """The CUDA the environment's torch was built with (slow: imports torch in a subprocess)."""
    python = os.path.join(prefix, "bin", "python")
    python = python if os.access(python, os.X_OK) else sys.executable
    done = run_bounded([python, "-c", "import torch; print(torch.version.cuda or '')"], TORCH_TIMEOUT_S)
    cuda = done.stdout.strip() if done.code == 0 else ""
    if not cuda:
        raise UsageError("--cuda", f"cannot tell which CUDA {prefix} is for: no cuda-version package record, no "
                         "version.json, no bin/nvcc, no libcudart that answers, no CUDA build of torch",
                         "pass --cuda MAJOR.MINOR")
    return parse_cuda(cuda), f"torch.version.cuda ({python})"
