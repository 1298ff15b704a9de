"""Host C/C++ compilers: the one nvcc will call, and the one torch uses for C++ sources."""

from __future__ import annotations

import os
import re
import shutil

from gptforge.probe.command import run_tool

_CLANG = re.compile(r"clang version (\d+(?:\.\d+)*)", re.ASCII)


def _run(args: list[str]) -> str | None:
    code, out, _ = run_tool(args)
    return out.strip() if code == 0 else None


def probe_compiler(command: str, source: str, env: dict | None = None) -> dict:
    """Kind (gcc/clang), version and resolved path of a compiler command such as ``g++-13``."""
    env = dict(os.environ if env is None else env)
    head = command.split()[0] if command.strip() else command
    path = head if os.path.sep in head else shutil.which(head, path=env.get("PATH", ""))
    info = {"command": command, "source": source, "path": path, "kind": None, "version": None}
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        info["path"] = None
        return info
    banner = _run([path, "--version"]) or ""
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
    for name in ("CUDAHOSTCXX", "CC", "NVCC_CCBIN"):
        if env.get(name):
            return env[name], name
    if nvcc_default:
        return nvcc_default, "nvcc default"
    return "gcc", "default gcc on PATH"


def probe_compilers(nvcc_default: str | None = None, env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    host, host_source = nvcc_host_command(env, nvcc_default)
    cxx = env.get("CXX") or "c++"
    return {
        "nvcc_host": probe_compiler(host, host_source, env),
        "cxx": probe_compiler(cxx, "CXX" if env.get("CXX") else "default c++ on PATH", env),
        "gcc": probe_compiler("gcc", "PATH", env),
        "gxx": probe_compiler("g++", "PATH", env),
    }
