"""nvcc: where it is, which CUDA release it is, which toolkit root and host compiler it really uses."""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

from gptforge.process import run_tool

_RELEASE = re.compile(r"release (\d+)\.(\d+)", re.ASCII)


def parse_nvcc_release(text: str) -> str | None:
    """``X.Y`` from ``nvcc --version`` output ("Cuda compilation tools, release 13.0, V13.0.88")."""
    match = _RELEASE.search(text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _run(args: list[str]) -> tuple[int, str]:
    code, out, err = run_tool(args)
    return code, out + err


def _dryrun(nvcc: str) -> tuple[str | None, str | None]:
    """(toolkit root, host compiler) as nvcc itself resolves them, seen through wrapper scripts.

    ``nvcc --dryrun`` prints ``#$ TOP=<root>/bin/..`` and then the host-compiler command line.
    """
    code, out = _run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull])
    if code != 0:
        return None, None
    top = host = None
    for line in out.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:].strip()
        if body.startswith("TOP="):
            top = os.path.realpath(body[4:])
        elif host is None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", body):
            host = body.split()[0].strip('"')
    return top, host


def probe_nvcc_at(path: str) -> dict:
    """One nvcc binary: its version and the toolkit root and host compiler it uses."""
    info = {"path": path, "real_path": None, "version": None, "toolkit_root": None, "host_compiler": None, "error": None}
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        info["error"] = f"{path} does not exist or is not executable"
        return info
    info["real_path"] = os.path.realpath(path)
    code, out = _run([path, "--version"])
    info["version"] = parse_nvcc_release(out) if code == 0 else None
    if info["version"] is None:
        info["error"] = f"'{path} --version' gave no 'release X.Y' line: {out.strip()[-200:]}"
        return info
    info["toolkit_root"], info["host_compiler"] = _dryrun(path)
    return info


def cuda_home_setting(env: dict) -> tuple[str | None, str | None]:
    """(path, source) of the CUDA root that torch's cpp_extension (and DeepSpeed, apex) would use.

    Same order as ``torch.utils.cpp_extension._find_cuda_home``: CUDA_HOME, CUDA_PATH, the parent of
    the directory holding ``nvcc`` on PATH, then /usr/local/cuda if it exists.
    """
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            return env[name], name
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), "nvcc on PATH"
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "default /usr/local/cuda"
    return None, None


def probe_nvcc(env: dict | None = None) -> dict:
    """nvcc under the CUDA root and nvcc on PATH, and whether they are the same release."""
    env = dict(os.environ if env is None else env)
    home, _source = cuda_home_setting(env)
    home_nvcc = os.path.join(home, "bin", "nvcc") if home else None
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    same = bool(home_nvcc and on_path and os.path.realpath(on_path) == os.path.realpath(home_nvcc))
    with ThreadPoolExecutor(max_workers=2) as pool:  # two different files: at once (each may hang until its timeout)
        home_job = pool.submit(probe_nvcc_at, home_nvcc) if home_nvcc else None
        path_job = pool.submit(probe_nvcc_at, on_path) if on_path and not same else None
        from_home = home_job.result() if home_job else None
        from_path = path_job.result() if path_job else None
    if same:
        from_path = {**from_home, "path": on_path}  # the same file: do not run it twice
    versions = {p["version"] for p in (from_home, from_path) if p and p["version"]}
    both = bool(from_home and from_home["version"] and from_path and from_path["version"])
    return {
        "cuda_home": from_home,
        "path": from_path,
        "agree": (len(versions) == 1) if both else None,
        "version": (from_home or {}).get("version") or (from_path or {}).get("version"),
    }
