"""One small ELF reader for the three backends.

It reads what safejit needs and nothing more: section headers and names, symbol
tables, program headers, the dynamic table and dynamic relocations. Every
artifact passes through it once per compile, so it reads with a few ``struct``
calls and never copies a table it does not use (a general ELF library costs
milliseconds here; this costs tens of microseconds). Its input is untrusted:
whatever the bytes hold — truncated, offsets past the end, sizes that overflow,
tables that overlap, another class or byte order — it returns an answer or
raises :class:`ElfError`, and nothing else (``fuzz/fuzz_parsers.py``,
``tests/property/test_parsers_survive_untrusted_bytes.py``)::

    from safejit.backends import _elf

    _elf.dynsym_functions(so_bytes)        # host: ('add', 'scale')
    _elf.section_names(obj_bytes)          # Ascend: ['', '.text', '.ascend.meta.k', ...]
    elf = _elf.Elf(cubin)                  # CUDA: sections, symbols, EIATTR records
    info = elf.section(".nv.info")
    records = list(_elf.eiattr_records(elf.section_data(info))) if info else []
    elf.segments(), elf.dynamic(), elf.at(vaddr, size)   # the loader's view

The host backend's check that a shared object runs no code of its own when
``dlopen`` maps it reads through the loader's view (``_load_time.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

__all__ = [
    "MAX_DYNAMIC",
    "PT_DYNAMIC",
    "PT_GNU_STACK",
    "PT_LOAD",
    "SHT_DYNSYM",
    "SHT_NOBITS",
    "SHT_PROGBITS",
    "SHT_SYMTAB",
    "Elf",
    "ElfError",
    "Section",
    "Segment",
    "Symbol",
    "dynsym_functions",
    "eiattr_records",
    "section_names",
]

SHT_PROGBITS: Final = 1
SHT_SYMTAB: Final = 2
SHT_NOBITS: Final = 8
SHT_DYNSYM: Final = 11
PT_LOAD: Final = 1
PT_DYNAMIC: Final = 2
PT_GNU_STACK: Final = 0x6474E551
_STT_FUNC: Final = 2
#: More dynamic entries than this is no object a linker made (they hold ~30): the
#: reader stops rather than build a table the size of the file.
MAX_DYNAMIC: Final = 1 << 16
_EIFMT_SIZES: Final = {1: 0, 2: 1, 3: 2}  # NVAL, BVAL, HVAL; SVAL (4) carries a u16 size


class ElfError(ValueError):
    """The bytes are not an ELF file this reader can read. The only exception the
    reader raises; callers translate it (``LoadError``)."""


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class Segment(NamedTuple):
    """A program header (the loader's view), in one field order for both classes."""

    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


class Symbol(NamedTuple):
    name: str
    #: ``STT_*`` (low 4 bits of st_info) and ``STB_*`` (high 4 bits).
    type: int
    bind: int
    shndx: int
    value: int
    size: int


class _Layout:
    """The structs of one ELF class and byte order."""

    __slots__ = ("addr", "dyn", "ehdr", "is64", "phdr", "rel", "rela", "shdr", "sym", "sym_fields", "word")

    def __init__(self, is64: bool, end: str) -> None:
        self.is64 = is64
        self.word = 8 if is64 else 4
        # e_type e_machine e_version e_entry e_phoff e_shoff e_flags e_ehsize
        # e_phentsize e_phnum e_shentsize e_shnum e_shstrndx, from byte 16
        self.ehdr = struct.Struct(end + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"))
        # name type flags addr offset size link info addralign entsize
        self.shdr = struct.Struct(end + ("IIQQQQIIQQ" if is64 else "10I"))
        # 64: type flags offset vaddr paddr filesz memsz align; 32: flags comes 7th
        self.phdr = struct.Struct(end + ("IIQQQQQQ" if is64 else "8I"))
        # 64: name info other shndx value size; 32: name value size info other shndx
        self.sym = struct.Struct(end + ("IBBHQQ" if is64 else "IIIBBH"))
        self.sym_fields = (1, 3, 4, 5) if is64 else (3, 5, 1, 2)  # info, shndx, value, size
        self.dyn = struct.Struct(end + ("qQ" if is64 else "iI"))
        self.rel = struct.Struct(end + ("QQ" if is64 else "II"))
        self.rela = struct.Struct(end + ("QQq" if is64 else "IIi"))
        self.addr = struct.Struct(end + ("Q" if is64 else "I"))


_LAYOUTS: Final = {
    b"\x01\x01": _Layout(False, "<"),
    b"\x01\x02": _Layout(False, ">"),
    b"\x02\x01": _Layout(True, "<"),
    b"\x02\x02": _Layout(True, ">"),
}


def _cstr(data: bytes, start: int, end: int) -> str:
    """The NUL-terminated string at ``start``, which must end before ``end``."""
    stop = data.find(b"\0", start, end) if 0 <= start < end else -1
    if stop < 0:
        raise ElfError(f"string at {start:#x} does not end inside its table")
    return data[start:stop].decode("utf-8", "replace")


def _names_at(data: bytes, base: int, end: int, offsets: list[int]) -> list[str]:
    """The names at ``offsets`` into the string table ``data[base:end]``, each decoded once,
    in all at most twice the table's size and a MiB: a crafted file whose 65,535 headers
    each named a suffix of one long string made gigabytes of text; a real one (a cubin of
    hundreds of instantiations with 20 kB mangled names) names each string once."""
    found: dict[int, str] = {}
    budget = 2 * (end - base) + (1 << 20)
    names = []
    for off in offsets:
        name = found.get(off)
        if name is None:
            name = found[off] = _cstr(data, base + off, end)
            budget -= len(name)
            if budget < 0:
                raise ElfError("section names take more than twice their table's size")
        names.append(name)
    return names


class Elf:
    """An ELF file's header and section headers, read on construction (the rest on
    demand). Raises :class:`ElfError` for bytes it cannot read."""

    __slots__ = (
        "_loads",
        "_names",
        "_ph",
        "_raw",
        "_segments",
        "data",
        "elf_class",
        "layout",
        "machine",
        "order",
        "shstrndx",
        "type",
    )

    def __init__(self, data: bytes) -> None:
        layout = _LAYOUTS.get(data[4:6]) if data[:4] == b"\x7fELF" else None
        if layout is None:
            raise ElfError("not an ELF file (magic, class or byte order)")
        if len(data) < 16 + layout.ehdr.size:
            raise ElfError("truncated ELF header")
        (etype, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, shstrndx) = (
            layout.ehdr.unpack_from(data, 16)
        )
        self.data = data
        self.layout = layout
        self.elf_class, self.order = data[4], data[5]
        self.type, self.machine, self.shstrndx = etype, machine, shstrndx
        # (e_shnum 0 with extended numbering, > 65279 sections, reads as no sections)
        self._raw = _table(data, shoff, shnum, shentsize, layout.shdr, "section")
        self._segments: tuple[Segment, ...] | None = None
        self._loads: list[tuple[int, int, int]] | None = None
        self._ph = (phoff, phnum, phentsize)
        self._names: list[str] | None = None

    # -- sections ------------------------------------------------------------
    def string_table(self, index: int) -> tuple[int, int]:
        """``(start, end)`` in the file of the string table section ``index``."""
        if index >= len(self._raw):
            raise ElfError(f"string table index {index} is out of range")
        h = self._raw[index]
        start, end = h[4], h[4] + h[5]
        if end > len(self.data):
            raise ElfError("a string table lies past the end of the file")
        return start, end

    def _section_names(self) -> list[str]:
        if self._names is None:
            if not self._raw:
                self._names = []
            else:
                base, end = self.string_table(self.shstrndx)
                self._names = _names_at(self.data, base, end, [h[0] for h in self._raw])
        return self._names

    def names(self) -> list[str]:
        """Every section's name, in header order (index 0's is empty)."""
        return list(self._section_names())

    def section_at(self, index: int) -> Section:
        """Section header ``index`` (an index into :meth:`names`)."""
        return _section(self._section_names()[index], self._raw[index])

    def sections(self) -> list[Section]:
        """Every section header, index 0 included, with its name."""
        return [_section(n, h) for n, h in zip(self._section_names(), self._raw, strict=True)]

    def of_type(self, sh_type: int) -> list[Section]:
        """The sections of type ``sh_type`` (``SHT_DYNSYM``…), in header order."""
        rows = [h for h in self._raw if h[1] == sh_type]
        if not rows:
            return []
        base, end = self.string_table(self.shstrndx)
        names = _names_at(self.data, base, end, [h[0] for h in rows])
        return [_section(n, h) for n, h in zip(names, rows, strict=True)]

    def section(self, name: str) -> Section | None:
        """The first section named ``name``, or None."""
        return self.sections_named(name).get(name)

    def sections_named(self, *names: str, sh_type: int | None = None) -> dict[str, Section]:
        """The first section of each of ``names`` there is (of type ``sh_type``, if
        given), in one pass."""
        if not self._raw:
            return {}
        if self._names is None:
            # Names unread so far: read in place, keeping only those asked for.
            base, end = self.string_table(self.shstrndx)
            want = {n.encode(): n for n in names}
            data, find = self.data, self.data.find
            found = {}
            for h in self._raw:
                if sh_type is not None and h[1] != sh_type:
                    continue
                at = base + h[0]
                stop = find(b"\0", at, end) if at < end else -1
                if stop < 0:
                    raise ElfError(f"a section name at {at:#x} does not end inside its table")
                name = want.get(data[at:stop])
                if name is not None and name not in found:
                    found[name] = _section(name, h)
            return found
        out: dict[str, Section] = {}
        for name, h in zip(self._names, self._raw, strict=True):
            if name in names and name not in out and (sh_type is None or h[1] == sh_type):
                out[name] = _section(name, h)
        return out

    def section_data(self, section: Section) -> bytes:
        """The section's bytes (none for ``SHT_NOBITS``)."""
        if section.type == SHT_NOBITS:
            return b""
        return _slice(self.data, section.offset, section.size, "section")

    def symbols(self, section: Section) -> list[Symbol]:
        """The entries of a symbol table section, names from the string table it links."""
        s_base, s_end = self.string_table(section.link)
        data = self.data
        i_info, i_shndx, i_value, i_size = self.layout.sym_fields
        out = []
        for f in self.symbol_rows(section):
            info = f[i_info]
            out.append(
                Symbol(_cstr(data, s_base + f[0], s_end), info & 0xF, info >> 4, f[i_shndx], f[i_value], f[i_size])
            )
        return out

    def symbol_names(self, section: Section) -> list[str]:
        """The names of a symbol table's entries, in order."""
        s_base, s_end = self.string_table(section.link)
        data = self.data
        return [_cstr(data, s_base + f[0], s_end) for f in self.symbol_rows(section)]

    def symbol_rows(self, section: Section) -> Iterator[tuple[int, ...]]:
        """The raw entries of a symbol table (``layout.sym`` fields, names unread)."""
        return self.layout.sym.iter_unpack(_whole(self.section_data(section), self.layout.sym.size))

    def symbol_name(self, section: Section, row: tuple[int, ...]) -> str:
        """The name of a raw entry of the symbol table ``section``."""
        start, end = self.string_table(section.link)
        return _cstr(self.data, start + row[0], end)

    # -- the loader's view ---------------------------------------------------
    def segments(self) -> tuple[Segment, ...]:
        if self._segments is None:
            phoff, phnum, phentsize = self._ph
            rows = _table(self.data, phoff, phnum, phentsize, self.layout.phdr, "program")
            if self.layout.is64:
                self._segments = tuple(Segment(r[0], r[1], r[2], r[3], r[5], r[6]) for r in rows)
            else:
                self._segments = tuple(Segment(r[0], r[6], r[1], r[2], r[4], r[5]) for r in rows)
        return self._segments

    def at(self, vaddr: int, size: int) -> bytes:
        """``size`` bytes at virtual address ``vaddr``, as a ``PT_LOAD`` maps them from
        the file (what the loader reads: it never looks at section headers)."""
        if self._loads is None:
            self._loads = [(s.vaddr, s.vaddr + s.filesz, s.offset) for s in self.segments() if s.type == PT_LOAD]
        for start, end, offset in self._loads:
            if start <= vaddr and vaddr + size <= end:
                return _slice(self.data, offset + (vaddr - start), size, "mapped")
        raise ElfError(f"{size} bytes at {vaddr:#x} are not mapped from the file")

    def dynamic(self) -> list[tuple[int, int]] | None:
        """``(tag, value)`` of the dynamic table up to ``DT_NULL``, read where the loader
        reads it (``PT_DYNAMIC``'s address); None without ``PT_DYNAMIC``."""
        seg = next((s for s in self.segments() if s.type == PT_DYNAMIC), None)
        if seg is None:
            return None
        dyn = self.layout.dyn
        out: list[tuple[int, int]] = []
        for tag, value in dyn.iter_unpack(_whole(self.at(seg.vaddr, seg.filesz), dyn.size)):
            if tag == 0:
                return out
            if len(out) == MAX_DYNAMIC:
                raise ElfError(f"the dynamic table has more than {MAX_DYNAMIC} entries")
            out.append((tag, value))
        raise ElfError("the dynamic table has no DT_NULL")


def _section(name: str, h: tuple[int, ...]) -> Section:
    return Section(name, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[9])


def _table(data: bytes, offset: int, count: int, entsize: int, row: struct.Struct, what: str) -> list[tuple[int, ...]]:
    """``count`` rows of ``row`` at ``offset``, all inside ``data``."""
    if count == 0:
        return []
    if entsize != row.size:
        raise ElfError(f"{what} header entries are {entsize} bytes, not {row.size}")
    return list(row.iter_unpack(_slice(data, offset, count * entsize, f"{what} header table")))


def _slice(data: bytes, offset: int, size: int, what: str) -> bytes:
    if offset + size > len(data):
        raise ElfError(f"{what} bytes at {offset:#x}+{size:#x} lie past the end of the file")
    return data[offset : offset + size]


def _whole(data: bytes, size: int) -> bytes:
    """``data`` cut to whole entries of ``size`` bytes (a partial last entry is ignored)."""
    return data[: len(data) - len(data) % size]


def dynsym_functions(data: bytes) -> tuple[str, ...]:
    """Defined global/weak functions of every ``SHT_DYNSYM`` table, sorted, without
    ``_init``/``_fini``: a host kernel's exported functions."""
    elf = Elf(data)
    i_info, i_shndx, _, _ = elf.layout.sym_fields
    names: set[str] = set()
    for h in elf._raw:
        if h[1] != SHT_DYNSYM:
            continue
        s_base, s_end = elf.string_table(h[6])
        for f in elf.layout.sym.iter_unpack(_whole(_slice(data, h[4], h[5], "symbol table"), elf.layout.sym.size)):
            info = f[i_info]
            # FUNC; GLOBAL or WEAK; defined
            if info & 0xF == _STT_FUNC and 1 <= info >> 4 <= 2 and f[i_shndx] != 0:
                names.add(_cstr(data, s_base + f[0], s_end))
    names.discard("_init")
    names.discard("_fini")
    return tuple(sorted(names))


def section_names(data: bytes) -> list[str]:
    """Every section's name, in header order (index 0's is empty)."""
    return Elf(data).names()


def eiattr_records(info: bytes) -> Iterator[tuple[int, bytes]]:
    """``(attribute, value)`` of the EIATTR records in a cubin's ``.nv.info`` section
    (NVIDIA's format: a format byte, an attribute byte, then a value of 0, 1 or 2
    bytes, or a u16 size and that many bytes). Stops at the first record it cannot
    read; a value cut short by the section's end is returned short."""
    i, n = 0, len(info)
    while i + 2 <= n:
        fmt, attr = info[i], info[i + 1]
        if fmt == 4:
            if i + 4 > n:
                return
            size = info[i + 2] | info[i + 3] << 8
            yield attr, info[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt in _EIFMT_SIZES:
            size = _EIFMT_SIZES[fmt]
            yield attr, info[i + 2 : i + 2 + size]
            i += 2 + size
        else:
            return
