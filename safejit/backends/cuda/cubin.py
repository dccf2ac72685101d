"""Reading a CUDA cubin (an ELF file) without a GPU: its kernels, the parameter
layout the compiler recorded for each (``.nv.info.<kernel>``) and the stack frame
of each function (``.nv.info``), through the one ELF reader (``backends/_elf.py``)."""

from __future__ import annotations

import struct
from typing import Final

from ...errors import LoadError
from .._elf import Elf, ElfError, eiattr_records

__all__ = ["KernelParams", "cubin_frame_sizes", "cubin_kernels"]

#: kernel name -> [(offset, size), ...] in parameter order
KernelParams = dict[str, list[tuple[int, int]]]

_EIATTR_FRAME_SIZE: Final = 0x11
_EIATTR_KPARAM_INFO: Final = 0x17


def _sections(cubin: bytes) -> tuple[Elf, dict[str, int]]:
    """The cubin and the index of each section name (of two of one name, the later)."""
    elf = Elf(cubin)
    if elf.elf_class != 2 or elf.order != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    return elf, {name: i for i, name in enumerate(elf.names())}


def _kparams(info: bytes) -> list[tuple[int, int]]:
    params: dict[int, tuple[int, int]] = {}
    for attr, value in eiattr_records(info):
        if attr == _EIATTR_KPARAM_INFO and len(value) >= 12:
            _, ordinal, offset, word = struct.unpack_from("<IHHI", value)
            params[ordinal] = (offset, (word >> 18) & 0x3FFF)
    return [params[k] for k in sorted(params)]


def cubin_kernels(cubin: bytes) -> KernelParams:
    """Kernels (entry functions) of a cubin with their parameter layouts."""
    out: KernelParams = {}
    try:
        elf, sections = _sections(cubin)
        for name, index in sections.items():
            if name.startswith(".nv.info.") and f".text.{name[9:]}" in sections:
                out[name[9:]] = _kparams(elf.section_data(elf.section_at(index)))
    except ElfError as exc:
        raise LoadError(f"artifact is not a readable cubin: {exc}") from exc
    return dict(sorted(out.items()))


def cubin_frame_sizes(cubin: bytes) -> dict[str, int]:
    """Stack frame bytes (local memory, spills included) per function, from the
    cubin itself — NVRTC does not always return ptxas's verbose log. Empty for a
    cubin it cannot read (the frames are a diagnostic)."""
    try:
        elf, sections = _sections(cubin)
        symtab, info = sections.get(".symtab"), sections.get(".nv.info")
        names = elf.symbol_names(elf.section_at(symtab)) if symtab is not None else []
        out = {}
        for attr, value in eiattr_records(elf.section_data(elf.section_at(info)) if info is not None else b""):
            if attr == _EIATTR_FRAME_SIZE and len(value) >= 8:
                index, size = struct.unpack_from("<II", value)
                if size and index < len(names):
                    out[names[index]] = size
        return out
    except ElfError:
        return {}
