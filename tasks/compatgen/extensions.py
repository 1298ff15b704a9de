"""The extension tables made from artifacts (run through ``python tasks/compat_refresh.py``).

flash_attn_wheels.toml: per flash-attn release tag, the wheels its publish workflow builds (runner, Pythons,
torch versions, CUDA, C++ ABI flags), from tasks/compatgen/inputs/flash-attn-publish-matrix.txt (the workflow's
build_wheels matrix read at each tag, and the torch build its install step takes for each torch version; the row's
source is the workflow file at that tag).
te_wheels.toml: per TransformerEngine release on PyPI, the Pythons its packages accept (Requires-Python)
and the glibc floor of its core wheel's manylinux tag, from tasks/compatgen/inputs/pypi-transformer-engine.txt.
"""

from __future__ import annotations

from collections import defaultdict

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from gptforge.compat.host_libs import manylinux_glibc
from compatgen import DATA, INPUTS, generated_from

FLASH_INPUT = INPUTS / "flash-attn-publish-matrix.txt"
FLASH_OUTPUT = DATA / "flash_attn_wheels.toml"
TE_INPUT = INPUTS / "pypi-transformer-engine.txt"
TE_OUTPUT = DATA / "te_wheels.toml"
TE_FILES = "https://pypi.org/project/{project}/{version}/#files"


def _quoted(items) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def flash_attn_table(text: str) -> str:
    """flash_attn_wheels.toml text: one row per release tag whose workflow builds wheels."""
    lines = [generated_from(FLASH_INPUT.name),
             "# flash-attn release -> the linux x86_64 wheels its publish workflow builds.", ""]
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        tag, url, *fields = line.split("\t")
        matrix = dict(field.split("=", 1) for field in fields)
        torch = sorted({".".join(v.split(".")[:2]) for v in matrix["torch-version"].split()},
                       key=lambda v: Version(v))
        cuda = sorted({v.split(".")[0] if "." in v else v[:-1] for v in matrix["cuda-version"].split()}, key=int)
        abi = [flag.lower() == "true" for flag in matrix["cxx11_abi"].split()] or [False]
        lines += ["[[release]]", f'version = "{tag.removeprefix("v")}"', f'os = "{matrix["os"]}"',
                  f"python = {_quoted(matrix['python-version'].split())}", f"torch = {_quoted(torch)}",
                  f"cuda_major = {_quoted(cuda)}", "cxx11_abi = [" + ", ".join(str(a).lower() for a in sorted(set(abi))) + "]",
                  f"torch_builds = {_quoted(matrix['torch-build'].split())}", f'source = "{url}"', ""]
    return "\n".join(lines)


def _name_version(filename: str) -> tuple[str, Version, frozenset] | None:
    try:
        name, version, _, tags = parse_wheel_filename(filename)
        return str(name), version, tags
    except (InvalidWheelFilename, InvalidVersion):
        pass
    try:
        name, version = parse_sdist_filename(filename)
        return str(name), version, frozenset()
    except (InvalidSdistFilename, InvalidVersion):
        return None


def te_table(text: str) -> str:
    """te_wheels.toml text: per TransformerEngine version, its Requires-Python and its core wheel's glibc floor."""
    requires: dict[Version, str] = {}
    glibc: dict[Version, set[Version]] = defaultdict(set)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        filename, python = line.split("\t")
        parsed = _name_version(filename)
        if parsed is None or parsed[1] == Version("0"):
            continue
        name, version, tags = parsed
        if version.is_prerelease or version.major == 0:
            continue
        if python:
            requires.setdefault(version, python)
        floors = {manylinux_glibc(tag.platform) for tag in tags if tag.platform.endswith("x86_64")}
        glibc[version] |= {f for f in floors if f is not None}
    lines = [generated_from(TE_INPUT.name),
             "# TransformerEngine version -> the Pythons its PyPI packages accept and its core wheel's glibc floor.", ""]
    for version in sorted(set(requires) | set(glibc)):
        lines += ["[[release]]", f'version = "{version}"']
        if version in requires:
            lines.append(f'requires_python = "{requires[version]}"')
        if glibc[version]:
            lines.append(f'glibc = "{min(glibc[version])}"')
        lines += [f'source = "{TE_FILES.format(project="transformer-engine", version=version)}"', ""]
    return "\n".join(lines)
