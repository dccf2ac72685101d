"""Reading a CUDA cubin (an ELF file) without a GPU: its kernels and the
parameter layout the compiler recorded for each (``.nv.info.<kernel>``)."""

from __future__ import annotations

import struct
from typing import Final

from ...errors import LoadError

__all__ = ["KernelParams", "cubin_kernels"]

#: kernel name -> [(offset, size), ...] in parameter order
KernelParams = dict[str, list[tuple[int, int]]]

_EIATTR_KPARAM_INFO: Final = 0x17
_EIFMT_SIZES: Final = {1: 0, 2: 1, 3: 2}  # NVAL, BVAL, HVAL; SVAL (4) carries a u16 size


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
        if attr == _EIATTR_KPARAM_INFO and len(value) >= 12:
            _, ordinal, offset, word = struct.unpack_from("<IHHI", value)
            params[ordinal] = (offset, (word >> 18) & 0x3FFF)
    return [params[k] for k in sorted(params)]


def cubin_kernels(cubin: bytes) -> KernelParams:
    """Kernels (entry functions) of a cubin with their parameter layouts."""
    try:
        sections = _sections(cubin)
    except (struct.error, ValueError, IndexError, OverflowError) as exc:
        raise LoadError(f"artifact is not a readable cubin: {exc}") from exc
    out: KernelParams = {}
    for name, data in sections.items():
        if name.startswith(".nv.info.") and f".text.{name[9:]}" in sections:
            out[name[9:]] = _kparams(data)
    return dict(sorted(out.items()))


_EIATTR_FRAME_SIZE: Final = 0x11


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
            if attr == _EIATTR_FRAME_SIZE and len(value) >= 8:
                index, size = struct.unpack_from("<II", value)
                if size and index < len(names):
                    out[names[index]] = size
        return out
    except (struct.error, ValueError, IndexError, OverflowError):
        return {}
