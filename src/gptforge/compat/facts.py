"""The version tables under compat/data/, loaded once into typed lookups.

Facts live in the TOML files (each row with its source URL); this module only reads them.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace, dataclass, field
from functools import cache
from importlib import resources

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptforge.compat.arches import Arch, parse_arch
from gptforge.core.versions import CudaVersion, DriverVersion, parse_cuda, parse_driver


ArchList = tuple[tuple[Arch, ...], tuple[Arch, ...]]  # (every arch of a build, the arches it carries PTX for too)


@cache  # a check reads the same tables again and again; callers only read what it returns
def load_table(name: str) -> dict:
    text = resources.files("gptforge.compat").joinpath("data", name).read_text(encoding="utf-8")
    return tomllib.loads(text)


def release_row(rows: list[dict], version: Version) -> dict | None:
    """The row of a versioned table (``versions`` = a specifier) that applies to this release."""
    public = Version(version.public)
    return next((r for r in rows if SpecifierSet(r["versions"]).contains(public, prereleases=True)), None)


def _cuda_key(version: CudaVersion) -> tuple[int, int]:
    return (version.major, version.minor)


def _cuda_range(spec: str) -> list[tuple[int, int]]:
    """'12.0-12.9' -> [(12,0)...(12,9)]; '11.8' -> [(11,8)]."""
    low, _, high = spec.partition("-")
    lo, hi = parse_cuda(low), parse_cuda(high or low)
    return [(lo.major, m) for m in range(lo.minor, hi.minor + 1)]


@dataclass(frozen=True)
class CudaRelease:
    version: CudaVersion
    ga_driver: DriverVersion
    updates: dict[int, DriverVersion]
    source: str

    def toolkit_driver(self, patch: int | None) -> DriverVersion:
        """Driver of that exact update (GA when the update is unknown or not given)."""
        return self.updates.get(patch, self.ga_driver) if patch else self.ga_driver


@dataclass(frozen=True)
class HostCompilers:
    gcc_min: int | None
    gcc_max: int | None
    clang_min: int | None
    clang_max: int | None
    source: str


@dataclass(frozen=True)
class TorchVariant:
    cuda: CudaVersion
    channel: str
    arches: tuple[Arch, ...] | None
    ptx: tuple[Arch, ...]
    cudnn: Version | None
    nccl: Version | None
    python: tuple[Version, Version] | None
    source: str
    versions: SpecifierSet | None = None  # the patch releases its arch list holds for (None: every one)

    def covers(self, version: Version) -> bool:
        """Does its arch list hold for this torch version? A version given without its patch ("1.3") is the release
        as a whole, judged by the newest builds."""
        return self.versions is None or len(version.release) < 3 or self.versions.contains(
            Version(version.public), prereleases=True)


@dataclass(frozen=True)
class CppExtension:
    """What one torch release's cpp_extension does with TORCH_CUDA_ARCH_LIST (None: not known)."""

    accepts: frozenset[str] | None = None
    rejects: frozenset[str] = frozenset()
    suffix_crash: bool | None = None
    source: str = ""
    clamps: bool = True  # with TORCH_CUDA_ARCH_LIST unset: the GPU's arch capped by torch's own highest sm_

    def rejected(self, arch: str) -> bool | None:
        """Does cpp_extension refuse this arch ("9.0", "10.1")? None when the table is not known."""
        if self.accepts is not None:
            return arch not in self.accepts
        return True if arch in self.rejects else None


@dataclass(frozen=True)
class TorchRelease:
    release: str
    python: tuple[Version, Version]
    cxx: int
    variants: tuple[TorchVariant, ...]
    source: str
    extension: CppExtension = CppExtension()
    pypi_cuda: CudaVersion | None = None  # the CUDA of the release's PyPI wheels, where their METADATA pins none
    wheels_complete: bool = False  # its pypi variants are every CUDA build download.pytorch.org has of it

    def variant(self, cuda: CudaVersion, channel: str | None = None) -> TorchVariant | None:
        found = [v for v in self.variants if _cuda_key(v.cuda) == _cuda_key(cuda)]
        if channel:
            found = [v for v in found if v.channel == channel]
        pypi = [v for v in found if v.channel == "pypi"]
        return (pypi or found or [None])[0]


@dataclass(frozen=True)
class CudnnRow:
    versions: frozenset[str]
    cuda: frozenset[tuple[int, int]]
    cc_min: tuple[int, int]
    cc_max: tuple[int, int]
    source: str
    cuda_text: str = ""


@dataclass
class Facts:
    cuda: dict[tuple[int, int], CudaRelease] = field(default_factory=dict)
    missing_cuda: dict[tuple[int, int], str] = field(default_factory=dict)
    minor_compat: dict[int, DriverVersion] = field(default_factory=dict)
    compilers: dict[tuple[int, int], HostCompilers] = field(default_factory=dict)
    arches: dict[tuple[int, int], tuple[Arch, ...]] = field(default_factory=dict)
    known_arches: tuple[Arch, ...] = ()
    renames: dict[Arch, tuple[Arch, tuple[int, int]]] = field(default_factory=dict)
    torch_named_arches: tuple[tuple[str, str], ...] = ()
    nvcc_default_arch: dict[tuple[int, int], Arch] = field(default_factory=dict)
    torch: dict[str, TorchRelease] = field(default_factory=dict)
    cxx_gcc_min: dict[int, Version] = field(default_factory=dict)
    cxx_nvcc_min: dict[int, CudaVersion] = field(default_factory=dict)
    cudnn: tuple[CudnnRow, ...] = ()
    extensions: dict = field(default_factory=dict)
    torch_python: dict[str, tuple[Version, ...]] = field(default_factory=dict)
    # torch version -> its PyPI wheels' glibc floor: their manylinux tag, or what their objects need where that is newer
    torch_glibc: dict[str, Version] = field(default_factory=dict)
    pypi_cuda: dict[str, CudaVersion] = field(default_factory=dict)  # torch version -> the CUDA of its PyPI wheel
    # torch version -> (every arch, the arches with PTX) of its PyPI wheel, read from the wheel
    pypi_arches: dict[str, ArchList] = field(default_factory=dict)

    # --- drivers -------------------------------------------------------------------------

    def toolkit_driver(self, cuda: CudaVersion) -> DriverVersion | None:
        """The driver the toolkit release needs without minor-version compatibility."""
        release = self.cuda.get(_cuda_key(cuda))
        return release.toolkit_driver(cuda.patch) if release else None

    def runtime_floor(self, cuda: CudaVersion) -> DriverVersion | None:
        """Lowest driver that runs code of this CUDA (minor-version compatibility included)."""
        toolkit = self.toolkit_driver(cuda)
        floor = self.minor_compat.get(cuda.major)
        if floor is None:
            return toolkit
        return min(floor, toolkit) if toolkit else floor

    def first_cuda_for(self, cc: tuple[int, int]) -> CudaVersion | None:
        """The oldest known toolkit that can build for this GPU."""
        for key in sorted(self.arches):
            if any(a.cc == cc and not a.suffix for a in self.arches[key]):
                return CudaVersion(*key)
        return None

    # --- compilers and arches ---------------------------------------------------------------

    def host_compilers(self, cuda: CudaVersion) -> HostCompilers | None:
        return self.compilers.get(_cuda_key(cuda))

    def targetable(self, cuda: CudaVersion) -> tuple[Arch, ...] | None:
        return self.arches.get(_cuda_key(cuda))

    def known_cc(self, cc: tuple[int, int]) -> bool:
        return any(a.cc == cc for a in self.known_arches)

    # --- torch and cuDNN ----------------------------------------------------------------------

    def torch_release(self, release: str) -> TorchRelease | None:
        return self.torch.get(release)

    def pypi_default_cuda(self, torch_version: Version) -> CudaVersion | None:
        """The CUDA of the wheel `pip install torch==X` takes from PyPI (None: not recorded)."""
        found = self.pypi_cuda.get(torch_version.public)
        if found is None and (release := self.torch.get(f"{torch_version.major}.{torch_version.minor}")):
            found = release.pypi_cuda
        return found

    def wheel_arches(self, torch_version: Version, cuda: CudaVersion) -> ArchList | None:
        """The arches (and those with PTX) of this exact version's PyPI wheel, when that wheel is for this CUDA."""
        wheel_cuda = self.pypi_cuda.get(torch_version.public)
        if wheel_cuda is None or _cuda_key(wheel_cuda) != _cuda_key(cuda):
            return None
        return self.pypi_arches.get(torch_version.public)

    def python_tags(self, torch_version: Version) -> tuple[Version, ...] | None:
        """The Pythons PyPI has linux x86_64 wheels of this exact torch version for (None: not recorded)."""
        return self.torch_python.get(torch_version.base_version)

    def cudnn_row(self, version: Version) -> CudnnRow | None:
        key = f"{version.major}.{version.minor}"
        return next((row for row in self.cudnn if key in row.versions), None)


def _load_cuda(facts: Facts) -> None:
    table = load_table("cuda_drivers.toml")
    for row in table["cuda"]:
        version = parse_cuda(row["version"])
        updates = {parse_cuda(k).patch: parse_driver(v) for k, v in row.get("updates", {}).items()}
        facts.cuda[_cuda_key(version)] = CudaRelease(version, parse_driver(row["ga_driver"]), updates, row["source"])
    for row in table.get("missing", []):
        facts.missing_cuda[_cuda_key(parse_cuda(row["version"]))] = row["note"]
    for row in table["minor_compat"]:
        facts.minor_compat[int(row["major"])] = parse_driver(row["min_driver"])


def _load_compilers(facts: Facts) -> None:
    for row in load_table("host_compilers.toml")["nvcc"]:
        facts.compilers[_cuda_key(parse_cuda(row["cuda"]))] = HostCompilers(
            row.get("gcc_min"), row.get("gcc_max"), row.get("clang_min"), row.get("clang_max"), row["source"]
        )


def _load_arches(facts: Facts) -> None:
    table = load_table("cuda_arches.toml")
    facts.known_arches = tuple(parse_arch(a) for a in table["known"])
    facts.torch_named_arches = tuple((name, arches) for name, arches in table["torch_named_arches"]["names"])
    for old, rename in table.get("renames", {}).items():
        facts.renames[parse_arch(old)] = (parse_arch(rename["to"]), _cuda_key(parse_cuda(rename["since"])))
    for row in table.get("nvcc_default_arch", []):
        for cuda in row["cuda"]:
            facts.nvcc_default_arch[_cuda_key(parse_cuda(cuda))] = parse_arch(row["arch"])
    for row in table["nvcc"]:
        arches = tuple(parse_arch(a) for a in row["arches"].split())
        for cuda in row["cuda"]:
            facts.arches[_cuda_key(parse_cuda(cuda))] = arches


def _arch_items(text: str) -> ArchList:
    """"3.5 5.0+PTX 7.5" -> (every arch, the arches that carry PTX too)."""
    items = text.split()
    return (tuple(parse_arch(a.removesuffix("+PTX")) for a in items),
            tuple(parse_arch(a.removesuffix("+PTX")) for a in items if a.endswith("+PTX")))


def _variant(row: dict, release_source: str) -> TorchVariant:
    arches: tuple[Arch, ...] | None = None
    ptx: tuple[Arch, ...] = ()
    if "arches" in row:
        arches, ptx = _arch_items(row["arches"])
    python = tuple(Version(p) for p in row["python"]) if "python" in row else None
    return TorchVariant(
        cuda=parse_cuda(row["cuda"]),
        channel=row.get("channel", "pypi"),
        arches=arches,
        ptx=ptx,
        cudnn=Version(row["cudnn"]) if "cudnn" in row else None,
        nccl=Version(row["nccl"]) if "nccl" in row else None,
        python=python,
        source=row.get("source", release_source),
        versions=SpecifierSet(row["versions"]) if "versions" in row else None,
    )


def _load_torch(facts: Facts) -> None:
    table = load_table("torch.toml")
    for row in table["cxx_standard"]:
        facts.cxx_gcc_min[row["std"]] = Version(row["gcc_min"])
        if "nvcc_min" in row:
            facts.cxx_nvcc_min[row["std"]] = parse_cuda(row["nvcc_min"])
    extensions = _cpp_extensions(table.get("cpp_extension", []))
    pins = _pypi_pins(facts)
    for row in table["release"]:
        low, high = (Version(p) for p in row["python"])
        variants = tuple(_with_pins(_variant(v, row["source"]), pins.get((row["version"], v["cuda"])))
                         for v in row.get("variant", []))
        pypi_cuda = parse_cuda(row["pypi_cuda"]) if "pypi_cuda" in row else None
        facts.torch[row["version"]] = TorchRelease(row["version"], (low, high), row["cxx"], variants, row["source"],
                                                   extensions.get(row["version"], CppExtension()), pypi_cuda,
                                                   "wheels_complete" in row)
    python = load_table("torch_python.toml")
    facts.torch_python = {row["version"]: tuple(Version(p) for p in row["python"]) for row in python["wheel"]}
    facts.torch_glibc = {row["version"]: Version(row["glibc"]) for row in python["wheel"] if "glibc" in row}
    _load_measured_wheels(facts)


def _pypi_pins(facts: Facts) -> dict[tuple[str, str], dict[str, set[str]]]:
    """(torch release, CUDA) -> the cuDNN and NCCL versions its PyPI wheels pin (torch_pypi_builds.toml)."""
    pins: dict[tuple[str, str], dict[str, set[str]]] = {}
    for row in load_table("torch_pypi_builds.toml")["wheel"]:
        facts.pypi_cuda[row["version"]] = parse_cuda(row["cuda"])
        release = ".".join(row["version"].split(".")[:2])
        found = pins.setdefault((release, row["cuda"]), {"cudnn": set(), "nccl": set()})
        for key in ("cudnn", "nccl"):
            if key in row:
                found[key].add(row[key])
    return pins


def _with_pins(variant: TorchVariant, pins: dict[str, set[str]] | None) -> TorchVariant:
    """A PyPI variant's cuDNN / NCCL, where the table leaves them out, from what every wheel of it pins."""
    if pins is None or variant.channel != "pypi":
        return variant
    filled = {key: Version(next(iter(pins[key]))) for key in ("cudnn", "nccl")
              if getattr(variant, key) is None and len(pins[key]) == 1}
    return replace(variant, **filled) if filled else variant


def _load_measured_wheels(facts: Facts) -> None:
    """What each version's PyPI wheel holds (torch_pypi_wheels.toml): its arches, its CUDA where
    torch_pypi_builds.toml has none, and the glibc its libraries need where that is above its tag's."""
    for row in load_table("torch_pypi_wheels.toml")["wheel"]:
        if "glibc" in row and (tagged := facts.torch_glibc.get(row["version"])) is not None:
            facts.torch_glibc[row["version"]] = max(tagged, Version(row["glibc"]))
        if "cuda" in row:
            facts.pypi_cuda.setdefault(row["version"], parse_cuda(row["cuda"]))
        if "arches" in row:
            facts.pypi_arches[row["version"]] = _arch_items(row["arches"])


def _cpp_extensions(rows: list[dict]) -> dict[str, CppExtension]:
    found: dict[str, CppExtension] = {}
    for row in rows:
        accepts = frozenset(row["accepts"].split()) if "accepts" in row else None
        entry = CppExtension(accepts, frozenset(row.get("rejects", ())), row.get("suffix_crash"), row["source"],
                             row.get("clamps", True))
        for release in row["releases"]:
            found[release] = entry
    return found


def _load_cudnn(facts: Facts) -> None:
    rows = []
    for row in load_table("cudnn.toml")["cudnn"]:
        cuda = frozenset(key for spec in row["cuda"] for key in _cuda_range(spec) if key not in facts.missing_cuda)
        low, high = (parse_arch(c).cc for c in row["cc"])
        rows.append(CudnnRow(frozenset(row["versions"]), cuda, low, high, row["source"], ", ".join(row["cuda"])))
    facts.cudnn = tuple(rows)


@cache
def facts() -> Facts:
    loaded = Facts()
    _load_cuda(loaded)
    _load_compilers(loaded)
    _load_arches(loaded)
    _load_torch(loaded)
    _load_cudnn(loaded)
    loaded.extensions = load_table("extensions.toml")
    return loaded
