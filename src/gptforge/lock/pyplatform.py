"""What a conda platform and its locked Python mean to PyPI: the marker environment
(pypi_modifiers/src/pypi_marker_env.rs) and the wheel tags it installs (pypi_modifiers/src/pypi_tags.rs)."""

from __future__ import annotations

from packaging.tags import Tag, compatible_tags, cpython_tags, mac_platforms

# subdir -> (os_name, sys_platform, platform_system, platform_machine)
_MARKERS = {"linux-64": ("posix", "linux", "Linux", "x86_64"),
            "linux-aarch64": ("posix", "linux", "Linux", "aarch64"),
            "linux-ppc64le": ("posix", "linux", "Linux", "ppc64le"),
            "osx-64": ("posix", "darwin", "Darwin", "x86_64"),
            "osx-arm64": ("posix", "darwin", "Darwin", "arm64"),
            "win-64": ("nt", "win32", "Windows", "AMD64"),
            "win-arm64": ("nt", "win32", "Windows", "ARM64")}


def marker_environment(subdir: str, python: str) -> dict[str, str]:
    os_name, sys_platform, system, machine = _MARKERS[subdir]
    major_minor = ".".join(python.split(".")[:2])
    return {"os_name": os_name, "sys_platform": sys_platform, "platform_system": system,
            "platform_machine": machine, "python_version": major_minor, "python_full_version": python,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": python, "platform_release": "", "platform_version": ""}


def _platform_tags(subdir: str, glibc: str, osx: str) -> list[str]:
    machine = _MARKERS[subdir][3]
    if subdir.startswith("linux"):
        top = int(glibc.split(".")[1])
        tags = [f"manylinux_2_{m}_{machine}" for m in range(top, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{machine}" for m, name in legacy.items() if m <= top]
        return tags + [f"linux_{machine}"]
    if subdir.startswith("osx"):
        major, minor = (int(x) for x in (osx.split(".") + ["0"])[:2])
        return list(mac_platforms((major, minor), machine))
    return ["win_amd64" if machine == "AMD64" else "win_arm64"]


def wheel_tags(subdir: str, python: str, glibc: str = "2.28", osx: str = "13.0") -> set[Tag]:
    """Every tag a wheel may carry to install on this platform with CPython `python`."""
    version = tuple(int(x) for x in python.split(".")[:2])
    platforms = _platform_tags(subdir, glibc, osx)
    return set(cpython_tags(version, platforms=platforms)) | set(
        compatible_tags(version, f"cp{version[0]}{version[1]}", platforms))
