"""What a prebuilt wheel was built for, from its name and metadata, judged against the combination.

flash-attn's release wheels carry it in the local version (``2.5.5+cu118torch2.2cxx11abiFALSE``: CUDA 11.8,
torch 2.2, the pre-C++11 ABI), TransformerEngine's core wheel in its name (``transformer_engine_cu12``),
torch's own wheels in ``+cu121``. A wheel for another torch minor, CUDA major or C++ ABI fails at import
("undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx11...").
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, replace
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from gptforge.core.installed import distributions
from gptforge.core.versions import CudaVersion, VersionError, parse_cuda
from gptforge.errors import FileReadError
from gptforge.reading import parse_json

_CUDA = re.compile(r"(?:^|[^a-z])cu(\d{2,3})(?=torch|\.|-|$)")
_TORCH = re.compile(r"torch(\d+)\.(\d+)")
_ABI = re.compile(r"cxx11abi(true|false)")
_METADATA_MAX = 1 << 20  # a wheel's METADATA is a few kB; never read a bomb
_NAME_CUDA = re.compile(r"-cu(\d{2})$")  # transformer-engine-cu12

# The combination field each project's version fills when the combination does not give it.
PROJECT_FIELDS = {"flash-attn": "flash_attn", "transformer-engine": "transformer_engine",
                  "transformer-engine-cu12": "transformer_engine", "transformer-engine-cu13": "transformer_engine",
                  "deepspeed": "deepspeed"}


@dataclass(frozen=True)
class WheelBuild:
    project: str  # canonical name: "flash-attn"
    version: Version
    origin: str  # the file name (or the installed distribution) it was read from
    torch: tuple[int, int] | None = None  # the torch major.minor it was built against
    torch_pin: str | None = None  # a Requires-Dist pin on torch ("==2.6.0"), from METADATA
    cuda: CudaVersion | None = None  # cu118 -> 11.8
    cuda_major: int | None = None  # cu12 -> 12 (also set from cuda)
    cxx11_abi: bool | None = None
    tags: frozenset[Tag] = frozenset()


def _cuda_tag(digits: str) -> tuple[CudaVersion | None, int]:
    """'118' -> 11.8, '92' -> 9.2 (torch's tags); '12' -> major 12 only (flash-attn's cu12 wheels are
    for any CUDA 12: CUDA majors run from 7 to a few past 13, so 10 to 19 is a major)."""
    if len(digits) == 2 and 10 <= int(digits) <= 19:
        return None, int(digits)
    cuda = parse_cuda(f"cu{digits}")
    return cuda, cuda.major


def _from_version(project: str, version: Version, origin: str, tags: frozenset[Tag] = frozenset()) -> WheelBuild:
    local = (version.local or "").lower()
    cuda, major = (None, None)
    if found := _CUDA.search(local):
        cuda, major = _cuda_tag(found.group(1))
    elif found := _NAME_CUDA.search(project):
        major = int(found.group(1))
    torch = _TORCH.search(local)
    abi = _ABI.search(local)
    return WheelBuild(project, version, origin, (int(torch.group(1)), int(torch.group(2))) if torch else None,
                      None, cuda, major, abi.group(1) == "true" if abi else None, tags)


def parse_wheel_name(filename: str) -> WheelBuild:
    """The build a wheel's file name states (PEP 427 name, parsed by packaging)."""
    try:
        name, version, _build, tags = parse_wheel_filename(Path(filename).name)
    except ValueError as err:  # InvalidWheelFilename, InvalidVersion, or a number of more digits than Python converts
        example = "flash_attn-2.5.5+cu118torch2.2cxx11abiFALSE-cp38-cp38-linux_x86_64.whl"
        raise VersionError(f"{filename!r} is not a wheel file name ({err}); give the .whl file or its exact "
                           f"name, e.g. {example}") from None
    return _from_version(str(name), version, Path(filename).name, frozenset(tags))


def _torch_pin(requires: list[str]) -> str | None:
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and str(req.specifier).startswith("=="):
            return str(req.specifier)
    return None


def read_wheel(path_or_name: str) -> WheelBuild:
    """A wheel file (its name, then its METADATA's torch pin) or just a wheel's file name."""
    build = parse_wheel_name(path_or_name)
    path = Path(path_or_name)
    try:
        if not path.is_file():
            return build
    except OSError:  # a name too long to be a file's
        return build
    try:
        with zipfile.ZipFile(path) as wheel:
            meta = next(n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            if wheel.getinfo(meta).file_size > _METADATA_MAX:
                raise VersionError(f"{path_or_name!r}: its METADATA is larger than {_METADATA_MAX} bytes")
            headers = HeaderParser().parsestr(wheel.read(meta).decode("utf-8", "replace"))
    except (zipfile.BadZipFile, StopIteration, OSError) as err:
        raise VersionError(f"{path_or_name!r} is not a readable wheel ({err or 'no .dist-info/METADATA'})") from None
    pin = _torch_pin(headers.get_all("Requires-Dist") or [])
    return replace(build, torch_pin=pin)


def _installed(dist) -> WheelBuild | None:
    """An installed distribution: the wheel file name pip recorded (direct_url.json) when it came from
    a URL or file, else its version's local tag."""
    name = dist.metadata["Name"]
    if not name:
        return None
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            url = parse_json(direct, "direct_url.json", expect=dict).get("url")
        except FileReadError:  # damaged, deep or not an object: the version's local tag still tells
            url = None
        if isinstance(url, str) and url.endswith(".whl"):
            try:
                return parse_wheel_name(url.rsplit("/", 1)[-1])
            except VersionError:
                pass
    try:
        version = Version(dist.version)
    except ValueError:  # InvalidVersion, or a number of more digits than Python converts
        return None
    build = _from_version(canonicalize_name(name), version, f"{name} {dist.version} (installed)")
    return replace(build, torch_pin=_torch_pin(dist.requires or []))


def installed_builds(projects=tuple(PROJECT_FIELDS)) -> tuple[WheelBuild, ...]:
    """The builds of the extension packages installed in this interpreter (importlib.metadata)."""
    found = []
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and canonicalize_name(name) in projects:
            build = _installed(dist)
            if build and (build.torch or build.cuda_major or build.cxx11_abi is not None or build.torch_pin):
                found.append(build)
    return tuple(sorted(found, key=lambda b: b.project))
