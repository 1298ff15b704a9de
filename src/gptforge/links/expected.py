"""Which prefix to repair and which CUDA release its libraries must match."""

from __future__ import annotations

import glob
import json
import os
import sys

from gptforge.errors import UsageError
from gptforge.links.families import Version
from gptforge.process import run_bounded

TORCH_TIMEOUT_S = 60  # importing torch from a cold disk; a hung interpreter is killed with its children


def resolve_prefix(given: str | None, environ=os.environ) -> str:
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
                         "pass --prefix DIR, or run inside the environment: pixi run gptforge fix-links")
    if not os.path.isdir(os.path.join(prefix, "lib")):
        raise UsageError(flag, f"{prefix} is not an environment prefix (it has no lib/ directory)",
                         "pass the directory that holds the environment's bin/ and lib/")
    return prefix


def parse_cuda(text, flag: str = "--cuda") -> Version:
    """(major, minor) by the compatibility engine's CUDA parser: fix-links and compat accept the same forms."""
    from gptforge.compat.versions import VersionError, parse_cuda as parse

    try:
        if not isinstance(text, str):
            raise VersionError(f"{text!r} is a {type(text).__name__}, not a version string")
        version = parse(text)
    except VersionError as err:
        raise UsageError(flag, str(err), "write it as MAJOR.MINOR, e.g. --cuda 12.8") from None
    return version.major, version.minor


def expected_cuda(given: str | None, prefix: str, dry_run: bool = False) -> tuple[Version, str]:
    """(major, minor) and where it came from: --cuda, the cuda-version record, or torch (not in a dry run,
    which runs nothing from the prefix)."""
    if given is not None:
        return parse_cuda(given), "--cuda"
    record = _cuda_version_record(prefix)
    if record:
        return record
    if dry_run:
        raise UsageError("--cuda", f"{prefix} has no cuda-version package record, and a dry run does not run the "
                         "environment's python to ask torch", "pass --cuda MAJOR.MINOR")
    return _torch_cuda(prefix)


def _cuda_version_record(prefix: str) -> tuple[Version, str] | None:
    for path in sorted(glob.glob(os.path.join(prefix, "conda-meta", "cuda-version-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError, RecursionError):
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
        raise UsageError("--cuda", f"cannot tell which CUDA {prefix} is for: no cuda-version package record and "
                         "no CUDA build of torch", "pass --cuda MAJOR.MINOR")
    return parse_cuda(cuda), f"torch.version.cuda ({python})"
