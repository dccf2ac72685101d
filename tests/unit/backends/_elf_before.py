"""The ELF readers as they were before ``backends/_elf.py`` (commit 4625eb4: the
host backend's ``.dynsym`` reader, the cubin reader's two EIATTR walkers, and
pyelftools for Ascend section names), kept only so that a test can pin that the
one reader gives the same answers on real artifacts. Not used by the package."""

from __future__ import annotations

import struct
from typing import Final

_EIFMT_SIZES: Final = {1: 0, 2: 1, 3: 2}


def _dynsym_functions(data: bytes) -> tuple[str, ...]:
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("bad ELF magic")
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        shoff, shentsize, shnum = (
            struct.unpack_from(end + "Q", data, 0x28)[0],
            *struct.unpack_from(end + "HH", data, 0x3A),
        )
        sec = struct.Struct(end + "IIQQQQIIQQ")  # name type flags addr offset size link info align entsize
        sym = struct.Struct(end + "IBBHQQ")  # name info other shndx value size
    else:
        shoff, shentsize, shnum = (
            struct.unpack_from(end + "I", data, 0x20)[0],
            *struct.unpack_from(end + "HH", data, 0x2E),
        )
        sec = struct.Struct(end + "IIIIIIIIII")
        sym = struct.Struct(end + "IIIBBH")  # name value size info other shndx
    headers = [sec.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for h in headers:
        if h[1] != 11:  # SHT_DYNSYM
            continue
        strtab = headers[h[6]]
        str_off, str_end = strtab[4], strtab[4] + strtab[5]
        for off in range(h[4], h[4] + h[5], sym.size):
            fields = sym.unpack_from(data, off)
            name_off, info, shndx = (fields[0], fields[1], fields[3]) if is64 else (fields[0], fields[3], fields[5])
            if info & 0xF != 2 or info >> 4 not in (1, 2) or shndx == 0:  # FUNC; GLOBAL|WEAK; defined
                continue
            start = str_off + name_off
            stop = data.index(b"\0", start, str_end)
            names.add(data[start:stop].decode("utf-8", "replace"))
    names.discard("_init")
    names.discard("_fini")
    return tuple(sorted(names))


def _sections(data: bytes) -> dict[str, bytes]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sec = struct.Struct("<IIQQQQIIQQ")
    headers = [sec.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]
    out = {}
    for h in headers:
        start = names_off + h[0]
        name = data[start : data.index(b"\0", start)].decode("utf-8", "replace")
        out[name] = b"" if h[1] == 8 else data[h[4] : h[4] + h[5]]  # SHT_NOBITS has no bytes
    return out


def _kparams(info: bytes) -> list[tuple[int, int]]:
    params: dict[int, tuple[int, int]] = {}
    i = 0
    while i + 2 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == 4:
            if i + 4 > len(info):
                break
            (size,) = struct.unpack_from("<H", info, i + 2)
            value = info[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt in _EIFMT_SIZES:
            value = info[i + 2 : i + 2 + _EIFMT_SIZES[fmt]]
            i += 2 + _EIFMT_SIZES[fmt]
        else:
            break
        if attr == 0x17 and len(value) >= 12:
            _, ordinal, offset, word = struct.unpack_from("<IHHI", value)
            params[ordinal] = (offset, (word >> 18) & 0x3FFF)
    return [params[k] for k in sorted(params)]


def cubin_kernels(cubin: bytes) -> dict[str, list[tuple[int, int]]]:
    sections = _sections(cubin)
    out = {}
    for name, data in sections.items():
        if name.startswith(".nv.info.") and f".text.{name[9:]}" in sections:
            out[name[9:]] = _kparams(data)
    return dict(sorted(out.items()))


def _records(info: bytes) -> list[tuple[int, bytes]]:
    out = []
    i = 0
    while i + 2 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == 4:
            if i + 4 > len(info):
                break
            (size,) = struct.unpack_from("<H", info, i + 2)
            out.append((attr, info[i + 4 : i + 4 + size]))
            i += 4 + size
        elif fmt in _EIFMT_SIZES:
            out.append((attr, info[i + 2 : i + 2 + _EIFMT_SIZES[fmt]]))
            i += 2 + _EIFMT_SIZES[fmt]
        else:
            break
    return out


def cubin_frame_sizes(cubin: bytes) -> dict[str, int]:
    """Stack frame bytes (local memory, spills included) per function, from the
    cubin itself — NVRTC does not always return ptxas's verbose log."""
    try:
        sections = _sections(cubin)
        symtab, strtab = sections.get(".symtab", b""), sections.get(".strtab", b"")
        names = []
        for off in range(0, len(symtab) - 23, 24):
            (name_off,) = struct.unpack_from("<I", symtab, off)
            names.append(strtab[name_off : strtab.index(b"\0", name_off)].decode("utf-8", "replace"))
        out = {}
        for attr, value in _records(sections.get(".nv.info", b"")):
            if attr == 0x11 and len(value) >= 8:
                index, size = struct.unpack_from("<II", value)
                if size and index < len(names):
                    out[names[index]] = size
        return out
    except (struct.error, ValueError, IndexError, OverflowError):
        return {}


def ascend_section_names(binary: bytes) -> list[str]:
    import io

    from elftools.elf.elffile import ELFFile

    return [s.name for s in ELFFile(io.BytesIO(binary)).iter_sections()]
