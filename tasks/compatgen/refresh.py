"""Rebuild the tables that come from artifacts, from inputs recorded in tasks/compatgen/inputs/.

    python tasks/compat_refresh.py            # offline: recorded inputs -> the generated tables
    python tasks/compat_refresh.py --fetch    # record PyPI's torch files and their metadata anew, then rebuild

torch_python.toml: for each torch version on PyPI, the CPython versions it has linux x86_64 wheels
for, read from the wheel file names (the python tag of the wheel name, PEP 427).
torch_conda_builds.toml: for each package of the anaconda pytorch channel, the SASS arches its
libraries carry (cuobjdump) and the cuDNN it bundles, from a recorded table (its URL at a commit is the
first line of tasks/compatgen/inputs/pytorch-conda-arches.md).
flash_attn_wheels.toml and te_wheels.toml: see compat/extensions.py.
torch_pypi_builds.toml: for each torch version, the CUDA runtime, cuDNN and NCCL its linux x86_64
wheel on PyPI pins (the nvidia-* Requires-Dist of the wheel's own METADATA, served per PEP 658),
recorded in tasks/compatgen/inputs/pypi-torch-requires.txt.
torch_pypi_wheels.toml: for each torch version, what its linux x86_64 wheel on PyPI holds (glibc floor of its
objects, CUDA, arches): see compat/torch_wheels.py.
Every row names where it came from.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from gptforge.compat.arches import arch_list_items, parse_arch
from gptforge.compat.host_libs import manylinux_glibc
from gptforge.storage import write_atomic
from compatgen import DATA, INPUTS, extensions, generated_from, torch_wheels

SIMPLE_URL = "https://pypi.org/simple/torch/"
INPUT = INPUTS / "pypi-simple-torch.txt"
OUTPUT = DATA / "torch_python.toml"
CONDA_INPUT = INPUTS / "pytorch-conda-arches.md"
CONDA_OUTPUT = DATA / "torch_conda_builds.toml"
REQUIRES_INPUT = INPUTS / "pypi-torch-requires.txt"
REQUIRES_OUTPUT = DATA / "torch_pypi_builds.toml"
PROJECT_FILES = "https://pypi.org/project/torch/{version}/#files"
_PACKAGE = re.compile(r"^\|\s*(pytorch-(\d+\.\d+\.\d+)(?:\+\w+)?-py([\d.]+)_cuda(\d+\.\d+)[\d.]*_cudnn([\d.]+)_\d+)"
                      r"\s*\|([^|]*)\|")
_RECORDED_FROM = re.compile(r"recorded from (https://\S+)")


def _linux_x86_64(tags) -> set[str]:
    """CPython versions ("3.12") among a wheel's tags that install on linux x86_64 (free-threaded builds apart)."""
    found = set()
    for tag in tags:
        if "linux" not in tag.platform or not tag.platform.endswith("x86_64") or not tag.interpreter.startswith("cp"):
            continue
        if tag.abi.endswith("t"):
            continue
        digits = tag.interpreter[2:]
        found.add(f"{digits[0]}.{digits[1:]}")
    return found


def _glibc_floors(tags) -> set[Version]:
    """The glibc floors the linux x86_64 platform tags among a wheel's tags name (manylinux1 -> 2.5)."""
    floors = {manylinux_glibc(tag.platform) for tag in tags if tag.platform.endswith("x86_64")}
    return {floor for floor in floors if floor is not None}


def python_table(filenames: list[str]) -> str:
    """torch_python.toml text from the wheel file names PyPI lists for torch."""
    pythons: dict[Version, set[str]] = defaultdict(set)
    glibc: dict[Version, set[Version]] = defaultdict(set)
    for name in filenames:
        try:
            _, version, _, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        pythons[version] |= _linux_x86_64(tags)
        if _linux_x86_64(tags):
            glibc[version] |= _glibc_floors(tags)
    lines = [
        generated_from("pypi-simple-torch.txt"),
        "# torch version -> the CPython versions PyPI has linux x86_64 wheels of it for (wheel name tags), and the",
        "# oldest glibc those wheels install on (their manylinux platform tag, PEP 600).",
        f'source = "{SIMPLE_URL}"',
        "",
    ]
    for version in sorted(pythons):
        found = sorted(pythons[version], key=lambda v: tuple(int(p) for p in v.split(".")))
        if not found:
            continue
        listed = ", ".join(f'"{p}"' for p in found)
        lines += ["[[wheel]]", f'version = "{version}"', f"python = [{listed}]"]
        if glibc[version]:
            lines.append(f'glibc = "{min(glibc[version])}"')
        lines += [f'source = "{PROJECT_FILES.format(version=version)}"', ""]
    return "\n".join(lines)


def conda_builds_table(text: str) -> str:
    """torch_conda_builds.toml text from the recorded table: one row per (torch, CUDA, cuDNN, arches),
    with the packages (one per Python) that carry exactly that list."""
    source = _RECORDED_FROM.search(text)
    if source is None:
        raise ValueError(f"{CONDA_INPUT.name}: the first line must say 'recorded from <URL at a commit>'")
    builds: dict[tuple, list[str]] = defaultdict(list)
    for line in text.splitlines():
        if match := _PACKAGE.match(line):
            package, torch, _python, cuda, cudnn, listed = match.groups()
            arches = " ".join(str(parse_arch(a)) for a in arch_list_items(listed))
            builds[(Version(torch), Version(cuda), cudnn, arches)].append(package)
    lines = [
        generated_from(CONDA_INPUT.name),
        "# anaconda pytorch-channel package -> the SASS arches its libraries carry and the cuDNN it bundles.",
        "",
    ]
    for (torch, cuda, cudnn, arches), packages in sorted(builds.items(), key=lambda kv: kv[0][:3], reverse=True):
        names = ", ".join(f'"{p}"' for p in sorted(packages))
        lines += ["[[build]]", f'torch = "{torch}"', f'cuda = "{cuda}"', f'cudnn = "{cudnn}"', f'arches = "{arches}"',
                  f"packages = [{names}]", f'source = "{source.group(1)}"', ""]
    return "\n".join(lines)


# nvidia-cuda-runtime-cu12 (to CUDA 12), cuda-toolkit[cudart] (CUDA 13 wheels), nvidia-cudnn-cuXX,
# nvidia-nccl-cuXX -> the table's field
_PINNED = re.compile(r"^(?:nvidia-(cuda-runtime|cudnn|nccl)(?:-cu\d+)?|(cuda-toolkit))$")
_FIELD = {"cuda-runtime": "cuda", "cuda-toolkit": "cuda", "cudnn": "cudnn", "nccl": "nccl"}
_RECORDED = ("nvidia-", "cuda-toolkit")


def pypi_builds_table(text: str) -> str:
    """torch_pypi_builds.toml text from the recorded Requires-Dist lines: one row per torch version."""
    rows: dict[Version, dict] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        wheel, url, requirement = line.split("\t")
        version = parse_wheel_filename(wheel)[1]
        row = rows.setdefault(version, {"wheel": wheel, "source": url + ".metadata"})
        req = Requirement(requirement)
        match = _PINNED.match(canonicalize_name(req.name))
        pins = [spec.version for spec in req.specifier if spec.operator == "=="]
        if match and pins:
            pinned = Version(pins[0])
            field = _FIELD[match.group(1) or match.group(2)]
            row[field] = ".".join(map(str, pinned.release[:2])) if field == "cuda" else str(pinned)
    lines = [
        generated_from(REQUIRES_INPUT.name),
        "# torch version -> the CUDA runtime, cuDNN and NCCL its linux x86_64 wheel on PyPI pins (METADATA).",
        "",
    ]
    for version in sorted(rows):
        row = rows[version]
        if "cuda" not in row:
            continue  # a release whose PyPI wheel bundles its CUDA libraries pins none
        lines += ["[[wheel]]", f'version = "{version}"', f'cuda = "{row["cuda"]}"']
        lines += [f'{key} = "{row[key]}"' for key in ("cudnn", "nccl") if key in row]
        lines += [f'wheel = "{row["wheel"]}"', f'source = "{row["source"]}"', ""]
    return "\n".join(lines)


def recorded_filenames(path: Path = INPUT) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]


def _write(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


def fetch_files() -> list[dict]:
    request = urllib.request.Request(SIMPLE_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["files"]


def _linux_wheels_per_version(files: list[dict]) -> dict[Version, list[dict]]:
    """Each version's CPython linux x86_64 wheels, by file name (every such wheel of a version pins the same)."""
    wheels: dict[Version, list[dict]] = defaultdict(list)
    for entry in sorted(files, key=lambda e: e["filename"]):
        try:
            _, version, _, tags = parse_wheel_filename(entry["filename"])
        except InvalidWheelFilename:
            continue
        if _linux_x86_64(tags):
            wheels[version].append(entry)
    return wheels


def _metadata(entry: dict) -> str | None:
    """The wheel's METADATA from its PEP 658 file; None where the index serves none for it."""
    try:
        with urllib.request.urlopen(entry["url"] + ".metadata", timeout=60) as response:
            return response.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        if err.code != 404:
            raise
        return None


def fetch_requires(files: list[dict]) -> str:
    """The CUDA Requires-Dist of one wheel per version, from the first of its wheels with a PEP 658 metadata file."""
    lines = [f"# wheel<TAB>file URL<TAB>Requires-Dist, from each file's PEP 658 metadata ({SIMPLE_URL})"]
    for version, entries in sorted(_linux_wheels_per_version(files).items()):
        print(f"reading the metadata of torch {version}", file=sys.stderr)
        found = next(((e, m) for e in entries if (m := _metadata(e)) is not None), None)
        if found is None:
            lines.append(f"# torch {version}: none of its {len(entries)} linux x86_64 wheels has a metadata file")
            continue
        entry, metadata = found
        for line in metadata.splitlines():
            requirement = line.split(":", 1)[1].strip() if line.startswith("Requires-Dist:") else ""
            if requirement.startswith(_RECORDED):
                lines.append(f"{entry['filename']}\t{entry['url']}\t{requirement}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tasks/compat_refresh.py", description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help=f"record {SIMPLE_URL} anew before rebuilding")
    parser.add_argument("--measure", action="store_true",
                        help="download one linux x86_64 wheel per torch version and record what it holds (slow)")
    args = parser.parse_args(argv)
    if args.measure:
        wheels = _linux_wheels_per_version(fetch_files())
        torch_wheels.measure_all(wheels, lambda text: _write(torch_wheels.INPUT, text))
    if args.fetch:
        files = fetch_files()
        requires = fetch_requires(files)
        names = [entry["filename"] for entry in files]
        _write(INPUT, f"# the file names {SIMPLE_URL} lists (PEP 691 JSON)\n" + "\n".join(names) + "\n")
        _write(REQUIRES_INPUT, requires)
    _write(OUTPUT, python_table(recorded_filenames()))
    _write(CONDA_OUTPUT, conda_builds_table(CONDA_INPUT.read_text(encoding="utf-8")))
    _write(REQUIRES_OUTPUT, pypi_builds_table(REQUIRES_INPUT.read_text(encoding="utf-8")))
    measured = torch_wheels.INPUT.read_text(encoding="utf-8")
    _write(torch_wheels.OUTPUT, torch_wheels.table(measured))
    for output, make, source in ((extensions.FLASH_OUTPUT, extensions.flash_attn_table,
                                  extensions.FLASH_INPUT),
                                 (extensions.TE_OUTPUT, extensions.te_table, extensions.TE_INPUT)):
        _write(output, make(source.read_text(encoding="utf-8")))
    print(f"wrote {OUTPUT.name} from {INPUT.name}, {CONDA_OUTPUT.name} from {CONDA_INPUT.name}, "
          f"{REQUIRES_OUTPUT.name} from {REQUIRES_INPUT.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
