"""Read DT_SONAME from an ELF shared library: the name the dynamic loader records and looks up.

A tiny reader on purpose: it reads the ELF header, the program headers and the dynamic segment,
the same structures the loader uses, and nothing else. It costs a few small reads per file, which
keeps the every-activation check fast, and needs no dependency.
"""

from __future__ import annotations

import struct

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14


def read_soname(path: str) -> str | None:
    """The SONAME of ``path``; None when it is not an ELF file or has no SONAME."""
    try:
        with open(path, "rb") as f:
            return _soname(f)
    except (OSError, struct.error, ValueError):
        return None


def _soname(f) -> str | None:
    head = f.read(64)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    is64, end = head[4] == 2, "<" if head[5] == 1 else ">"
    if is64:
        (phoff,) = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
    else:
        (phoff,) = struct.unpack_from(end + "I", head, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, offset, vaddr, filesz = _phdr(table, i * phentsize, is64, end)
        if p_type == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return None
    strtab, soname = _dynamic_entries(f, dynamic, is64, end)
    if strtab is None or soname is None:
        return None
    return _read_string(f, _file_offset(loads, strtab) + soname)


def _phdr(table: bytes, at: int, is64: bool, end: str) -> tuple[int, int, int, int]:
    if is64:
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from(end + "IIQQQQ", table, at)
    else:
        p_type, offset, vaddr, _paddr, filesz = struct.unpack_from(end + "IIIII", table, at)
    return p_type, offset, vaddr, filesz


def _dynamic_entries(f, dynamic, is64: bool, end: str) -> tuple[int | None, int | None]:
    offset, size = dynamic
    f.seek(offset)
    data = f.read(size)
    fmt, step = (end + "qQ", 16) if is64 else (end + "iI", 8)
    strtab = soname = None
    for at in range(0, len(data) - step + 1, step):
        tag, value = struct.unpack_from(fmt, data, at)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
    return strtab, soname


def _file_offset(loads, vaddr: int) -> int:
    for seg_vaddr, seg_offset, filesz in loads:
        if seg_vaddr <= vaddr < seg_vaddr + filesz:
            return vaddr - seg_vaddr + seg_offset
    raise ValueError("string table outside every loaded segment")


def _read_string(f, offset: int) -> str | None:
    f.seek(offset)
    raw = f.read(256).split(b"\0", 1)[0]
    return raw.decode("ascii", "replace") or None
