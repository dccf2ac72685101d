"""A tiny ELF writer for tests: section headers, a ``.dynsym`` with its string table
and any extra sections, in either class and byte order (the system compiler makes
only 64-bit little-endian files here)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

SHT_PROGBITS, SHT_STRTAB, SHT_DYNSYM = 1, 3, 11
STT_FUNC, STT_OBJECT, STB_GLOBAL, STB_WEAK, STB_LOCAL = 2, 1, 1, 2, 0


def tiny_elf(
    *,
    is64: bool = True,
    little: bool = True,
    symbols: Sequence[tuple[str, int, int]] = (),
    sections: Sequence[tuple[str, int, bytes]] = (),
    machine: int = 62,
) -> bytes:
    """An ELF file (``ET_DYN``) whose ``.dynsym`` holds ``(name, st_info, st_shndx)``
    after the null symbol, plus ``(name, sh_type, data)`` sections."""
    end = "<" if little else ">"
    dynstr = bytearray(b"\0")
    rows = [(0, 0, 0)]
    for name, info, shndx in symbols:
        rows.append((len(dynstr), info, shndx))
        dynstr += name.encode() + b"\0"
    if is64:
        sym = struct.Struct(end + "IBBHQQ")
        dynsym = b"".join(sym.pack(off, info, 0, shndx, 0, 0) for off, info, shndx in rows)
    else:
        sym = struct.Struct(end + "IIIBBH")
        dynsym = b"".join(sym.pack(off, 0, 0, info, 0, shndx) for off, info, shndx in rows)
    named = [(".dynstr", SHT_STRTAB, bytes(dynstr), 0), (".dynsym", SHT_DYNSYM, dynsym, 1)]
    named += [(name, kind, data, 0) for name, kind, data in sections]
    shstrtab = bytearray(b"\0")
    offsets = []
    for name, *_ in [*named, (".shstrtab",)]:
        offsets.append(len(shstrtab))
        shstrtab += name.encode() + b"\0"
    named.append((".shstrtab", SHT_STRTAB, bytes(shstrtab), 0))
    ehsize = 64 if is64 else 52
    body = bytearray()
    placed = []
    for _, _, data, _ in named:
        placed.append(ehsize + len(body))
        body += data + bytes(-len(data) % 8)
    shoff = ehsize + len(body)
    shdr = struct.Struct(end + ("IIQQQQIIQQ" if is64 else "10I"))
    headers = [bytes(shdr.size)]
    for (_, kind, data, link), name_off, at in zip(named, offsets, placed, strict=True):
        headers.append(shdr.pack(name_off, kind, 0, 0, at, len(data), link, 0, 8, sym.size if link else 0))
    ident = b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1]) + bytes(9)
    ehdr = struct.Struct(end + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"))
    head = ident + ehdr.pack(3, machine, 1, 0, 0, shoff, 0, ehsize, 0, 0, shdr.size, len(headers), len(headers) - 1)
    return head + bytes(body) + b"".join(headers)
