"""Two facts read from a 64-bit ELF shared object, without running anything from it:

- what it needs from the host's glibc: the GLIBC_X.Y symbol versions in its version-needs section
  (.gnu.version_r, the table `readelf -V` prints). The loader refuses an object that needs a version the host's
  glibc lacks ("version `GLIBC_2.27' not found"), whatever the wheel's platform tag claims;
- the GPU code it carries: the arches of the cubins (SASS) and PTX in its .nv_fatbin section (what
  `cuobjdump --list-elf` / `--list-ptx` list; newer cuobjdump releases refuse to read the old arches).
"""

from __future__ import annotations

import re
import struct
from typing import BinaryIO

from packaging.version import Version

_SHT_GNU_VERNEED = 0x6FFFFFFE
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_KINDS = {1: "ptx", 2: "sass"}
_ARCH_SPECIFIC = 0x100000  # the fatbin entry flag of an arch-specific (sm_90a) cubin
_GLIBC = re.compile(rb"^GLIBC_(\d+\.\d+(?:\.\d+)?)$")


class NotElf(ValueError):
    pass


def _sections(data: BinaryIO) -> tuple[str, list[tuple[bytes, int, int, int, int]]]:
    """The byte order and (name, type, file offset, size, link) of each section of a 64-bit ELF file."""
    data.seek(0)
    ident = data.read(16)
    if ident[:4] != b"\x7fELF" or ident[4] != 2:
        raise NotElf("not a 64-bit ELF file")
    order = "<" if ident[5] == 1 else ">"
    data.seek(0x28)
    shoff, = struct.unpack(order + "Q", data.read(8))
    data.seek(0x3A)
    shentsize, shnum, shstrndx = struct.unpack(order + "HHH", data.read(6))
    rows = []
    for index in range(shnum):
        data.seek(shoff + index * shentsize)
        rows.append(struct.unpack(order + "IIQQQQI", data.read(44)))
    names = b"\0"
    if shstrndx < len(rows):
        data.seek(rows[shstrndx][4])
        names = data.read(rows[shstrndx][5]) or b"\0"
    return order, [(_string(names, name), kind, offset, size, link)
                   for name, kind, _flags, _addr, offset, size, link in rows]


def _string(strings: bytes, offset: int) -> bytes:
    return strings[offset:strings.index(b"\0", offset)]


def needed_versions(data: BinaryIO) -> list[tuple[bytes, bytes]]:
    """(library, version name) for every entry of the version-needs section, in file order."""
    order, sections = _sections(data)
    found = []
    for _name, kind, offset, size, link in sections:
        if kind != _SHT_GNU_VERNEED:
            continue
        _, _, str_offset, str_size, _ = sections[link]
        data.seek(str_offset)
        strings = data.read(str_size)
        data.seek(offset)
        needs = data.read(size)
        entry = 0
        while True:
            _version, count, file_name, aux, next_entry = struct.unpack_from(order + "HHIII", needs, entry)
            at = entry + aux
            for _ in range(count):
                _hash, _flags, _other, name, next_aux = struct.unpack_from(order + "IHHII", needs, at)
                found.append((_string(strings, file_name), _string(strings, name)))
                at += next_aux
            if not next_entry:
                break
            entry += next_entry
    return found


def glibc_needed(data: BinaryIO) -> Version | None:
    """The newest GLIBC_ version the object needs (None: it needs none)."""
    versions = [Version(m.group(1).decode()) for _, name in needed_versions(data) if (m := _GLIBC.match(name))]
    return max(versions, default=None)


def device_code(data: BinaryIO) -> set[tuple[str, str]]:
    """("sass" or "ptx", arch) of the cubins / PTX in the object's fatbins: ("sass", "9.0a"), ("ptx", "7.5")."""
    order, sections = _sections(data)
    found: set[tuple[str, str]] = set()
    for name, _kind, offset, size, _link in sections:
        if name != b".nv_fatbin":
            continue
        at, end = offset, offset + size
        while at + 16 <= end:
            data.seek(at)
            magic, _version, header_size, fat_size = struct.unpack(order + "IHHQ", data.read(16))
            if magic != _FATBIN_MAGIC:
                at += 8  # the fatbins of the section are 8-byte aligned
                continue
            entry, stop = at + header_size, at + header_size + fat_size
            while entry < stop:
                data.seek(entry)
                kind, _, entry_size, payload = struct.unpack(order + "HHIQ", data.read(16))
                *_, arch, _name_at, _name_len, flags = struct.unpack(order + "IIHHIIIQ", data.read(32))
                if kind in _FATBIN_KINDS:
                    found.add((_FATBIN_KINDS[kind], f"{arch // 10}.{arch % 10}{'a' if flags & _ARCH_SPECIFIC else ''}"))
                entry += entry_size + payload
            at = stop
    return found
