"""Reading shared objects: the GLIBC_ versions they need (tasks/compatgen/elf.py), and the arch lists the refresh reads
from the -gencode flags a torch wheel embeds."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from compatgen.elf import NotElf, device_code, glibc_needed, needed_versions
from compatgen.torch_wheels import arch_list, measure

_SHT_STRTAB, _SHT_PROGBITS, _SHT_GNU_VERNEED = 3, 1, 0x6FFFFFFE


def _elf(needs: dict[bytes, list[bytes]], fatbin: bytes = b"") -> bytes:
    """A 64-bit little-endian ELF holding a version-needs section (library -> version names) and a .nv_fatbin."""
    dynstr = bytearray(b"\0")

    def add(name: bytes) -> int:
        dynstr.extend(name + b"\0")
        return len(dynstr) - len(name) - 1

    verneed = bytearray()
    libraries = list(needs.items())
    for index, (library, versions) in enumerate(libraries):
        aux = b"".join(struct.pack("<IHHII", 0, 0, 0, add(v), 16 if i < len(versions) - 1 else 0)
                       for i, v in enumerate(versions))
        last = index == len(libraries) - 1
        verneed += struct.pack("<HHIII", 1, len(versions), add(library), 16, 0 if last else 16 + len(aux)) + aux
    shstrtab = b"\0.shstrtab\0.dynstr\0.gnu.version_r\0.nv_fatbin\0"
    bodies = [shstrtab, bytes(dynstr), bytes(verneed), fatbin]
    offsets, at = [], 64
    for body in bodies:
        offsets.append(at)
        at += len(body)
    shoff = at
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64,
                                                                     0, 0, 64, 5, 1)
    sections = [bytes(64)]
    for (name, kind, link), offset, body in zip([(1, _SHT_STRTAB, 0), (11, _SHT_STRTAB, 0),
                                                 (19, _SHT_GNU_VERNEED, 2), (34, _SHT_PROGBITS, 0)], offsets, bodies):
        sections.append(struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, len(body), link, 0, 1, 0))
    return header + b"".join(bodies) + b"".join(sections)


def _fatbin(entries: list[tuple[int, int, bool]]) -> bytes:
    """One fatbin of (kind: 1 PTX / 2 cubin, arch as nvcc numbers it, arch-specific) entries."""
    body = b""
    for kind, arch, specific in entries:
        payload = bytes(8)
        head = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + struct.pack(
            "<IIHHIIIQ", 0, 0, 0, 0, arch, 0, 0, 0x2011 | (0x100000 if specific else 0))
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


glibc_versions = st.builds(lambda minor: f"GLIBC_2.{minor}".encode(), st.integers(2, 40))


@given(st.lists(glibc_versions, min_size=1, max_size=6), st.lists(glibc_versions, max_size=4))
def test_the_glibc_floor_is_the_newest_glibc_version_any_library_needs(libc, libm):
    needs = {b"libc.so.6": libc, b"libstdc++.so.6": [b"GLIBCXX_3.4.30", b"CXXABI_1.3"]}
    if libm:
        needs[b"libm.so.6"] = libm
    data = io.BytesIO(_elf(needs))
    assert glibc_needed(data) == max(Version(v.decode().removeprefix("GLIBC_")) for v in libc + libm)
    assert [name for _, name in needed_versions(data)] == [v for names in needs.values() for v in names]


def test_an_object_that_needs_no_glibc_version_has_no_floor_and_a_non_elf_is_refused():
    assert glibc_needed(io.BytesIO(_elf({b"libfoo.so": [b"FOO_1.0"]}))) is None
    with pytest.raises(NotElf):
        glibc_needed(io.BytesIO(b"#!/bin/sh\n" + bytes(64)))


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([30, 35, 50, 61, 75, 80, 90, 100, 120]),
                          st.booleans()), max_size=12), st.integers(1, 3))
def test_device_code_lists_the_arch_of_every_cubin_and_ptx_in_the_fatbins(entries, copies):
    data = io.BytesIO(_elf({b"libc.so.6": [b"GLIBC_2.17"]}, _fatbin(entries) * copies))
    kinds = {1: "ptx", 2: "sass"}
    assert device_code(data) == {(kinds[k], f"{a // 10}.{a % 10}{'a' if s else ''}") for k, a, s in entries}


codes = st.sampled_from(["35", "37", "50", "52", "60", "61", "70", "75", "80", "86", "89", "90", "90a", "100",
                         "100a", "103", "120"])


@given(st.dictionaries(codes, st.sampled_from(["sass", "ptx", "both"]), min_size=1), st.randoms())
def test_gencode_flags_round_trip_to_the_arch_list(kinds, random):
    """The -gencode flags torch embeds give back its arches, oldest first, "+PTX" where code=compute_XY is built."""
    flags = [f"-gencode;arch=compute_{c},code={kind}_{c}" for c, k in kinds.items()
             for kind in {"sass": ["sm"], "ptx": ["compute"], "both": ["sm", "compute"]}[k]]
    random.shuffle(flags)
    if all(k == "ptx" for k in kinds.values()):
        assert arch_list({"gencode": ";".join(flags)}) is None  # torch.toml's notation has no PTX-only arch
        return
    listed = arch_list({"gencode": ";".join(flags)}).split()
    names = [item.removesuffix("+PTX") for item in listed]
    assert names == sorted(names, key=lambda a: (Version(a.rstrip("af")), a))
    expected = {f"{int(c.rstrip('a')) // 10}.{int(c.rstrip('a')) % 10}{'a' if c.endswith('a') else ''}"
                + ("+PTX" if k != "sass" else "") for c, k in kinds.items()}
    assert set(listed) == expected


def test_measuring_a_wheel_reads_its_cuda_glibc_floor_and_gencode_flags(tmp_path):
    flags = ("-gencode;arch=compute_50,code=sm_50;-gencode;arch=compute_90,code=sm_90;"
             "-gencode;arch=compute_90,code=compute_90")
    wheel = tmp_path / "torch-9.9.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/version.py", "__version__ = '9.9.0'\ncuda: Optional[str] = '12.8'\n")
        archive.writestr("torch/lib/libtorch_cuda.so", _elf({b"libc.so.6": [b"GLIBC_2.28"]}) + b"\0" + flags.encode()
                         + b"\0more")
        archive.writestr("torch/lib/libc10.so.1", _elf({b"libm.so.6": [b"GLIBC_2.17", b"GLIBC_2.29"]}))
        archive.writestr("torch/_C.pyi", "not an object")
    found = measure(wheel)
    assert found == {"cuda": "12.8", "glibc": "2.29", "gencode": flags}
    assert arch_list(found) == "5.0 9.0+PTX"


def test_a_wheel_without_gencode_flags_is_measured_by_its_cubins(tmp_path):
    wheel = tmp_path / "torch-1.0.0-cp37-cp37m-manylinux1_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/version.py", "cuda = '9.0.176'\n")
        archive.writestr("torch/lib/libcaffe2_gpu.so", _elf({b"libc.so.6": [b"GLIBC_2.17"]},
                                                            _fatbin([(2, 35, False), (2, 70, False), (1, 50, False)])))
    found = measure(wheel)
    assert found == {"cuda": "9.0", "glibc": "2.17", "sass": "3.5 7.0", "ptx": "5.0"}
    assert arch_list(found) == "3.5 5.0+PTX 7.0"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is not installed")
def test_the_glibc_floor_matches_readelf_on_this_interpreter():
    path = Path(sys.executable).resolve()
    listed = subprocess.run(["readelf", "-V", "--wide", str(path)], capture_output=True, text=True, check=True).stdout
    names = {line.split("Name: ")[1].split()[0] for line in listed.splitlines() if "Name: GLIBC_" in line}
    with path.open("rb") as data:
        assert str(glibc_needed(data)) == max((n.removeprefix("GLIBC_") for n in names), key=Version)
