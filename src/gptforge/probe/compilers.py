"""Host C/C++ compilers: the one nvcc will call, and the one torch uses for C++ sources."""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from gptforge.errors import UsageError
from gptforge.process import run_tool, split_command

HOST_VARIABLES = ("CUDAHOSTCXX", "CC", "NVCC_CCBIN")
_CLANG = re.compile(r"clang version (\d+(?:\.\d+)*)", re.ASCII)


def _run(args: list[str]) -> str | None:
    code, out, _ = run_tool(args)
    return out.strip() if code == 0 else None


def probe_compiler(command: str, source: str, env: dict | None = None) -> dict:
    """Kind (gcc/clang), version and resolved path of a compiler command such as ``g++-13``."""
    env = dict(os.environ if env is None else env)
    info = {"command": command, "source": source, "path": None, "kind": None, "version": None, "error": None}
    try:
        head = split_command(command, source)[0]
    except UsageError as err:
        info["error"] = err.message
        return info
    path = head if os.path.sep in head else shutil.which(head, path=env.get("PATH", ""))
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return info
    info["path"] = path
    code, out, err = run_tool([path, "--version"])
    if code == -1:
        info["error"] = f"'{path} --version': {err}"
    banner = out.strip() if code == 0 else ""
    clang = _CLANG.search(banner)
    if clang:
        info["kind"], info["version"] = "clang", clang.group(1)
    elif banner:
        info["kind"] = "gcc" if ("gcc" in banner.lower() or "g++" in banner.lower()
                                 or "Free Software Foundation" in banner) else "other"
        info["version"] = _run([path, "-dumpfullversion", "-dumpversion"])
    return info


def nvcc_host_command(env: dict, nvcc_default: str | None) -> tuple[str, str]:
    """(command, where it came from) for the host compiler nvcc will run.

    CUDAHOSTCXX is what CMake passes as ``-ccbin``; CC is what torch's cpp_extension passes as
    ``-ccbin``; NVCC_CCBIN is read by nvcc itself; otherwise nvcc's own default (seen in --dryrun).
    """
    for name in HOST_VARIABLES:
        if env.get(name):
            return env[name], name
    if nvcc_default:
        return nvcc_default, "nvcc default"
    return "gcc", "default gcc on PATH"


def probe_compilers(nvcc_default: str | None | Callable[[], str | None] = None, env: dict | None = None) -> dict:
    """The four compilers, probed at once (a hanging one costs one timeout, not four in a row).

    ``nvcc_default`` may be a function (waiting for the nvcc probe): it is called only when no
    environment variable names the host compiler.
    """
    env = dict(os.environ if env is None else env)
    cxx = env.get("CXX") or "c++"
    commands = {"cxx": (cxx, "CXX" if env.get("CXX") else "default c++ on PATH"), "gcc": ("gcc", "PATH"),
                "gxx": ("g++", "PATH")}
    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = {key: pool.submit(probe_compiler, command, source, env) for key, (command, source) in commands.items()}
        default = nvcc_default() if callable(nvcc_default) and not _host_from_env(env) else nvcc_default
        host, host_source = nvcc_host_command(env, None if callable(default) else default)
        jobs["nvcc_host"] = pool.submit(probe_compiler, host, host_source, env)
        return {key: jobs[key].result() for key in ("nvcc_host", "cxx", "gcc", "gxx")}


def _host_from_env(env: dict) -> bool:
    return any(env.get(name) for name in HOST_VARIABLES)
