"""What torch's PyPI wheels hold, read from the wheels themselves (``python tasks/compat_refresh.py --measure``
downloads one linux x86_64 wheel per version).

For each version, recorded in tasks/compatgen/inputs/pypi-torch-wheel-contents.txt:
- glibc: the newest GLIBC_ symbol version any of its shared objects needs (elf.py). The manylinux1 tag of
  the older wheels names glibc 2.5, but the objects were built on newer images and need more;
- cuda: the CUDA torch/version.py names (the build PyPI serves);
- gencode: the nvcc -gencode flags torch was built with, as its CUDA library embeds them (the string
  torch.cuda.get_arch_list() reads): the arches of torch's own kernels, and which carry PTX. The cubins of the
  CUDA libraries linked into it are not torch's list (a cu102 wheel holds sm_30 cubins that torch refuses);
- sass / ptx, for a wheel that embeds no such flags (1.0.x): the arches of every cubin / PTX its objects carry,
  torch's own and its libraries' alike, so at least the GPUs torch runs on.
"""

from __future__ import annotations

import mmap
import re
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from packaging.version import Version

from compatgen import DATA, INPUTS, generated_from
from compatgen.elf import NotElf, device_code, glibc_needed

INPUT = INPUTS / "pypi-torch-wheel-contents.txt"
OUTPUT = DATA / "torch_pypi_wheels.toml"
HEADER = ("# wheel<TAB>file URL<TAB>glibc=<newest GLIBC_ its shared objects need><TAB>cuda=<torch/version.py>"
          "<TAB>gencode=<the -gencode flags its CUDA library embeds>, or sass=<cubin arches><TAB>ptx=<PTX arches> "
          "(python tasks/compat_refresh.py --measure)")
_VERSION_CUDA = re.compile(r"""^cuda(?:: *[\w\[\]]+)? *= *['"]([\d.]+)['"]""", re.MULTILINE)
_GENCODE_START = b"-gencode;arch=compute_"
_GENCODE = re.compile(r"arch=compute_(\d+[af]?),code=(sm|compute)_(\d+[af]?)")


def _is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]


def _gencode_flags(path: Path) -> set[str]:
    """The NUL-terminated "-gencode;arch=compute_50,code=sm_50;..." strings in an object."""
    found: set[str] = set()
    with path.open("rb") as data, mmap.mmap(data.fileno(), 0, access=mmap.ACCESS_READ) as view:
        at = view.find(_GENCODE_START)
        while at != -1:
            end = view.find(b"\0", at)
            found.add(view[at:end].decode("ascii", "replace"))
            at = view.find(_GENCODE_START, end)
    return found


def measure(wheel: Path) -> dict[str, str]:
    """glibc / cuda / gencode of one wheel file."""
    floors: list[Version] = []
    flags: set[str] = set()
    code: set[tuple[str, str]] = set()
    found: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        for member in archive.namelist():
            if member.endswith("torch/version.py"):
                if match := _VERSION_CUDA.search(archive.read(member).decode("utf-8")):
                    found["cuda"] = ".".join(match.group(1).split(".")[:2])
            if not _is_shared_object(member):
                continue
            target = Path(scratch) / "object"
            with archive.open(member) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 24)
            try:
                with target.open("rb") as data:
                    if floor := glibc_needed(data):
                        floors.append(floor)
                    code |= device_code(data)
            except NotElf:
                continue
            if target.stat().st_size:  # an empty file cannot be mapped
                flags |= _gencode_flags(target)
    if floors:
        found["glibc"] = str(max(floors))
    if flags:
        found["gencode"] = " ".join(sorted(flags))
    else:
        for kind in ("sass", "ptx"):
            if arches := {arch for k, arch in code if k == kind}:
                found[kind] = " ".join(sorted(arches, key=_arch_key))
    return found


def _arch(code: str) -> str:
    """nvcc's numbering to torch.toml's: "90a" -> "9.0a", "120" -> "12.0"."""
    digits, suffix = code.rstrip("af"), code[len(code.rstrip("af")):]
    return f"{int(digits) // 10}.{int(digits) % 10}{suffix}"


def _arch_key(arch: str) -> tuple[Version, str]:
    return Version(arch.rstrip("af")), arch


def arch_list(row: dict[str, str]) -> str | None:
    """torch.toml's notation ("3.5 5.0+PTX 7.5") for a measured wheel: its -gencode flags (an arch with
    code=compute_XY carries PTX), else the arches its cubins and PTX are for."""
    if "gencode" in row:
        sass = {_arch(code) for _, kind, code in _GENCODE.findall(row["gencode"]) if kind == "sm"}
        ptx = {_arch(code) for _, kind, code in _GENCODE.findall(row["gencode"]) if kind == "compute"}
    else:
        sass, ptx = set(row.get("sass", "").split()), set(row.get("ptx", "").split())
    if not sass:
        return None
    return " ".join(f"{a}+PTX" if a in ptx else a for a in sorted(sass | ptx, key=_arch_key))


def measure_url(url: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        wheel = Path(scratch) / "torch.whl"
        with urllib.request.urlopen(url, timeout=600) as response, wheel.open("wb") as sink:
            shutil.copyfileobj(response, sink, 1 << 24)
        return measure(wheel)


def record_line(name: str, url: str, found: dict[str, str]) -> str:
    keys = ("glibc", "cuda", "gencode", "sass", "ptx")
    return "\t".join([name, url, *(f"{key}={found[key]}" for key in keys if key in found)])


def recorded(text: str) -> dict[Version, dict[str, str]]:
    """torch version -> what its measured wheel holds (and its file name and URL)."""
    rows: dict[Version, dict[str, str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, url, *fields = line.split("\t")
        rows[Version(name.split("-")[1])] = {"wheel": name, "url": url, **dict(f.split("=", 1) for f in fields)}
    return rows


def measure_all(wheels: dict[Version, list[dict]], write) -> None:
    """Record the newest-Python wheel of each version not recorded yet (``wheels``: version -> its PyPI file
    entries); the record is rewritten through ``write(text)`` after each wheel, so a broken run keeps its work."""
    text = INPUT.read_text(encoding="utf-8") if INPUT.exists() else ""
    rows = {version: line for line in text.splitlines() if line and not line.startswith("#")
            for version in recorded(line)}
    for version, entries in sorted(wheels.items()):
        if version in rows:
            continue
        entry = max(entries, key=lambda e: _python_of(e["filename"]))
        print(f"measuring {entry['filename']}", file=sys.stderr)
        rows[version] = record_line(entry["filename"], entry["url"], measure_url(entry["url"]))
        write("\n".join([HEADER, *(rows[v] for v in sorted(rows))]) + "\n")


def _python_of(name: str) -> tuple[int, ...]:
    digits = name.split("-")[2].removeprefix("cp")
    return (int(digits[0]), int(digits[1:] or 0))



def table(text: str) -> str:
    """torch_pypi_wheels.toml text from the recorded measurements: one row per torch version."""
    lines = [generated_from(INPUT.name),
             "# torch version -> what its linux x86_64 wheel on PyPI holds, read from the wheel: the newest GLIBC_",
             "# symbol version its shared objects need, the CUDA torch/version.py names, the arches of its -gencode",
             "# flags (or of its cubins, where it embeds none).",
             ""]
    for version, row in sorted(recorded(text).items()):
        lines += ["[[wheel]]", f'version = "{version}"']
        lines += [f'{key} = "{row[key]}"' for key in ("glibc", "cuda") if key in row]
        if arches := arch_list(row):
            lines.append(f'arches = "{arches}"')
        lines += [f'wheel = "{row["wheel"]}"', f'source = "{row["url"]}"', ""]
    return "\n".join(lines)
