"""Parse the version strings users paste and tools print, and write them back in one canonical form.

Accepted forms:
  driver  580.65.06, 570.26, 535.104.05 (kept zero-padded: 580.65.6 -> 580.65.06); a branch, 560;
          or the number torch prints ("found version 11040": a driver for CUDA 11.4)
  CUDA    12.4, 12.4.1, cu126 / cu92 (wheel tags), 12080 (torch / cudaRuntimeGetVersion encoding)
  torch   2.11.0, 2.11.0+cu130, 2.13.0+cpu
  gcc     13, 13.2, 13.2.0 (as many components as given)
  python  3.12, 3.12.4
  cuDNN   9.10.2.21, 9.10.2, 91002 / 8902 (torch.backends.cudnn.version() encoding)
  CC      9.0, 90, sm_90 -> (9, 0)

Every parser raises VersionError (a ValueError) with a one-line message on bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from packaging.version import InvalidVersion, Version


class VersionError(ValueError):
    """A version string that cannot be read; the message says what was expected."""


@total_ordering
@dataclass(frozen=True)
class DriverVersion:
    """An NVIDIA driver version; compares numerically, prints zero-padded like nvidia-smi."""

    parts: tuple[int, ...]
    reports_cuda: CudaVersion | None = None  # set for "11040": only the CUDA the driver supports is known

    def __str__(self) -> str:
        if self.reports_cuda is not None:
            return f"a driver for CUDA {self.reports_cuda} (reported as {self.reports_cuda.encoded})"
        major, *rest = self.parts
        return ".".join([str(major)] + [f"{p:02d}" for p in rest])

    @property
    def is_branch(self) -> bool:
        return len(self.parts) == 1

    def _key(self) -> tuple[int, ...]:
        # a branch ("560") stands for its newest release: a floor inside the branch counts as met
        return self.parts + ((999, 999) if self.is_branch else (0,) * (3 - len(self.parts)))

    def __lt__(self, other: DriverVersion) -> bool:
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DriverVersion) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


_DRIVER = re.compile(r"^(\d{3,4})(?:\.(\d{1,3}))?(?:\.(\d{1,3}))?$", re.ASCII)


def parse_driver(text: str) -> DriverVersion:
    """580.65.06, 570.26, a branch (560), or the CUDA version the driver reports as torch prints it (11040).

    The last form has no driver number: ``reports_cuda`` is set and the rules resolve it to the lowest
    driver of that CUDA (compat.context).
    """
    raw = str(text).strip()
    if _is_ascii_number(raw) and len(raw) in (4, 5):  # a driver branch has 3 digits; CUDA 9.1 prints as 9010
        try:
            return DriverVersion((), parse_cuda(raw))
        except VersionError:
            pass
    match = _DRIVER.match(raw)
    if not match:
        raise VersionError(f"{text!r} is not an NVIDIA driver version (expected e.g. 580.65.06, 570.26, a branch "
                           "such as 560, or the number torch prints, 12080)")
    return DriverVersion(tuple(int(g) for g in match.groups() if g is not None))


@total_ordering
@dataclass(frozen=True)
class CudaVersion:
    """A CUDA version. ``patch`` is the toolkit update when known (12.2.2), else None."""

    major: int
    minor: int
    patch: int | None = None

    def __str__(self) -> str:
        base = f"{self.major}.{self.minor}"
        return base if self.patch is None else f"{base}.{self.patch}"

    @property
    def release(self) -> CudaVersion:
        """major.minor only."""
        return CudaVersion(self.major, self.minor)

    @property
    def tag(self) -> str:
        """The wheel tag: cu126."""
        return f"cu{self.major}{self.minor}"

    @property
    def encoded(self) -> int:
        """torch / CUDA runtime encoding: 12.8 -> 12080."""
        return self.major * 1000 + self.minor * 10

    @classmethod
    def from_encoded(cls, value: int) -> CudaVersion:
        """12080 -> 12.8: what cudaRuntimeGetVersion, NVML and torch report (major*1000 + minor*10)."""
        return cls(value // 1000, value % 1000 // 10)

    def _key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch or 0)

    def __lt__(self, other: CudaVersion) -> bool:
        return self._key() < other._key()


_CUDA_DOTTED = re.compile(r"^(\d{1,2})\.(\d{1,2})(?:\.(\d{1,3}))?$", re.ASCII)
_CUDA_TAG = re.compile(r"^cu(\d{1,2})(\d)$", re.ASCII)


def _is_ascii_number(text: str) -> bool:
    """Digits 0-9 only: str.isdigit() also accepts other scripts' digits, which int() would read."""
    return text.isascii() and text.isdigit()


def parse_cuda(text: str) -> CudaVersion:
    raw = str(text).strip().lower()
    if match := _CUDA_DOTTED.match(raw):
        major, minor, patch = match.groups()
        return CudaVersion(int(major), int(minor), None if patch is None else int(patch))
    if match := _CUDA_TAG.match(raw):
        # cu92 -> 9.2, cu126 -> 12.6, cu130 -> 13.0 (CUDA minors are single digits)
        return CudaVersion(int(match.group(1)), int(match.group(2)))
    if _is_ascii_number(raw) and 4 <= len(raw) <= 5:
        value = int(raw)
        if value % 10 == 0 and value >= 7000:
            return CudaVersion.from_encoded(value)
    raise VersionError(f"{text!r} is not a CUDA version (expected e.g. 12.4, cu126 or 12080)")


def cuda_release(text: str | None) -> CudaVersion | None:
    """major.minor of a CUDA version string as tools print it (12.8.90, 13.0), None when it is not one."""
    try:
        return parse_cuda(text).release if text else None
    except VersionError:
        return None


@dataclass(frozen=True)
class TorchVersion:
    """A torch version with its build tag: 2.11.0+cu130 -> (2.11.0, CUDA 13.0)."""

    version: Version
    cuda: CudaVersion | None = None
    local: str | None = None  # the raw local tag: "cu130", "cpu", "rocm6.2"

    def __str__(self) -> str:
        return f"{self.version.public}+{self.local}" if self.local else self.version.public

    @property
    def release(self) -> str:
        """major.minor: the key of the torch table."""
        return f"{self.version.major}.{self.version.minor}"

    @property
    def is_cpu(self) -> bool:
        return self.local == "cpu"


def parse_torch(text: str) -> TorchVersion:
    raw = str(text).strip()
    public, _, local = raw.partition("+")
    try:
        version = Version(public)
    except InvalidVersion:
        raise VersionError(f"{text!r} is not a torch version (expected e.g. 2.11.0 or 2.11.0+cu130)") from None
    if version.local or not public or len(version.release) < 2:
        raise VersionError(f"{text!r} is not a torch version (expected e.g. 2.11.0 or 2.11.0+cu130)")
    if not local:
        return TorchVersion(version)
    local = local.lower()
    if local.startswith("cu"):
        return TorchVersion(version, parse_cuda(local), local)
    if re.fullmatch(r"[a-z0-9.]+", local):
        return TorchVersion(version, None, local)
    raise VersionError(f"{text!r}: unknown torch build tag '+{local}' (expected +cuXYZ or +cpu)")


_PLAIN = re.compile(r"^\d+(\.\d+){0,3}$", re.ASCII)


def _parse_plain(text: str, what: str, example: str, max_parts: int) -> Version:
    raw = str(text).strip()
    if not _PLAIN.match(raw) or raw.count(".") >= max_parts:
        raise VersionError(f"{text!r} is not a {what} version (expected e.g. {example})")
    return Version(raw)


def _parse_compiler(text: str, what: str, example: str) -> Version:
    version = _parse_plain(text, what, example, 3)
    if not 3 <= version.major <= 99:
        raise VersionError(f"{text!r} is not a {what} version (majors run from 3 to 99; e.g. {example})")
    return version


def parse_gcc(text: str) -> Version:
    return _parse_compiler(text, "gcc", "13, 13.2 or 13.2.0")


def parse_clang(text: str) -> Version:
    return _parse_compiler(text, "clang", "18 or 18.1.8")


def parse_python(text: str) -> Version:
    version = _parse_plain(text, "Python", "3.12 or 3.12.4", 3)
    if version.major != 3 or len(version.release) < 2:
        raise VersionError(f"{text!r} is not a Python 3 version (expected e.g. 3.12)")
    return version


def parse_cudnn(text: str) -> Version:
    """9.10.2.21 / 9.10.2 / 91002 (>= 9: M*10000+m*100+p) / 8902 (8.x: M*1000+m*100+p)."""
    raw = str(text).strip()
    if _is_ascii_number(raw) and len(raw) >= 4:
        value = int(raw)
        if not 1000 <= value <= 999999:
            raise VersionError(f"{text!r} is not a cuDNN version (encoded forms look like 91002 or 8902)")
        if value >= 90000:
            major, minor, patch = value // 10000, (value // 100) % 100, value % 100
        else:
            major, minor, patch = value // 1000, (value // 100) % 10, value % 100
        return Version(f"{major}.{minor}.{patch}")
    version = _parse_plain(text, "cuDNN", "9.10.2.21 or 91002", 4)
    if len(version.release) < 2:
        raise VersionError(f"{text!r} is not a cuDNN version (expected e.g. 9.10.2)")
    return version


def parse_nccl(text: str) -> Version:
    return _parse_plain(text, "NCCL", "2.29.7", 3)


def parse_release(text: str, what: str = "version") -> Version:
    """A generic dotted version (DeepSpeed 0.19.6, TransformerEngine 2.18, apex 0.1)."""
    try:
        return Version(str(text).strip())
    except InvalidVersion:
        raise VersionError(f"{text!r} is not a {what} version") from None


_CC = re.compile(r"^(?:sm_?|compute_)?(\d{1,2})\.?(\d)$", re.ASCII)


def parse_cc(text: str) -> tuple[int, int]:
    """9.0 / 90 / sm_90 -> (9, 0). Syntax only: gpus.validate_cc checks it is a real one."""
    raw = str(text).strip().lower()
    match = _CC.match(raw)
    if not match:
        raise VersionError(f"{text!r} is not a compute capability (expected e.g. 9.0 or sm_90)")
    return int(match.group(1)), int(match.group(2))


def format_cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"
