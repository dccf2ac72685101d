"""A small DWARF reader (versions 2 to 5, 32- and 64-bit): units, abbreviations and
the entries of ``.debug_info``, for ``_prototypes.py``.

It reads what safejit needs and nothing more, in ``_elf.py``'s style: an entry's
fixed-size values come out of one ``struct`` call per run of them (a plan per
abbreviation shape, kept across reads), a value nobody asked for is skipped, not
built, and a subtree is jumped over by its ``DW_AT_sibling``. Its input is
untrusted: whatever the bytes hold it returns an answer or raises
:class:`DwarfError`, and every step consumes bytes (a sibling only leads forward;
chains and nesting are bounded by the callers)::

    dwarf = Dwarf(Elf(so_bytes))            # None-safe: dwarf.units == [] without -g
    for unit in dwarf.units:
        tag, children, attrs, pos = dwarf.entry(unit, unit.top)   # the unit's own entry

Compressed sections (``-gz``, zlib) are inflated; zstd ones read as no debug info.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from typing import Final, NamedTuple

from ._elf import Elf, Section

__all__ = ["TAG_SUBPROGRAM", "Dwarf", "DwarfError", "Keep", "Unit"]

TAG_SUBPROGRAM: Final = 0x2E
AT_SIBLING: Final = 0x01
#: Fixed-size forms: form -> bytes (-1: the offset size, -2: the address size).
_FIXED: Final = {
    0x01: -2, 0x05: 2, 0x06: 4, 0x07: 8, 0x0B: 1, 0x0C: 1, 0x0E: -1, 0x11: 1, 0x12: 2, 0x13: 4, 0x14: 8,
    0x17: -1, 0x19: 0, 0x1C: 4, 0x1D: -1, 0x1E: 16, 0x1F: -1, 0x20: 8, 0x24: 8, 0x25: 1, 0x26: 2, 0x27: 3,
    0x28: 4, 0x29: 1, 0x2A: 2, 0x2B: 3, 0x2C: 4, 0x1F20: -1, 0x1F21: -1,
}  # fmt: skip
_ULEB_FORMS: Final = frozenset({0x0D, 0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02})
_BLOCK_FORMS: Final = {0x03: 2, 0x04: 4, 0x09: 0, 0x0A: 1, 0x18: 0}  # bytes of the length (0: ULEB)
_REF_FORMS: Final = frozenset({0x11, 0x12, 0x13, 0x14, 0x15})
_STRX: Final = frozenset({0x1A, 0x25, 0x26, 0x27, 0x28})
_ADDRX: Final = frozenset({0x1B, 0x29, 0x2A, 0x2B, 0x2C, 0x1F01})
#: Forms whose value lies in another section or file (type units, supplementary files).
_FAR: Final = frozenset({0x20, 0x1F20, 0x1F21, 0x1C, 0x1D, 0x24})
_STRUCT_CODES: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: A compressed debug section inflating past this is refused (a planted one could claim anything).
_MAX_INFLATED: Final = 256 << 20
_SECTIONS: Final = (".debug_info", ".debug_abbrev", ".debug_str", ".debug_line_str", ".debug_str_offsets")

Attrs = dict[int, object]
Abbrev = tuple[int, bool, tuple[tuple[int, int, int], ...]]
#: Steps to read an entry: ``(struct, ((attr, form, index, implicit), ...))`` for a run
#: of fixed-size values, ``(None, ((attr or -1, form, implicit, 0),))`` for one value.
_Plan = tuple[tuple[struct.Struct | None, tuple[tuple[int, int, int, int], ...]], ...]
#: Plans by abbreviation shape, shared by every read (one compiler makes the same few
#: hundred shapes again and again); bounded, so planted tables cannot grow it for ever.
_PLANS: dict[tuple[object, ...], _Plan] = {}
_MAX_PLANS: Final = 4096
#: Abbreviation tables by the section's bytes and offset: an artifact is read more than
#: once (when the compiler closes it, when it exits), and similar kernels share tables.
_TABLES: dict[tuple[bytes, int], dict[int, Abbrev]] = {}
_MAX_TABLES: Final = 64


class DwarfError(ValueError):
    """The debug info cannot be read. The only exception the reader raises."""


class Keep(NamedTuple):
    """Which attributes an entry read keeps: ``default``, or ``by_tag[tag]``. Values
    kept: ints, strings, True (a flag), ``("ref", offset in .debug_info)``,
    ``("addrx", index)``, ``("far", 0)`` (in another section: not followed)."""

    default: frozenset[int]
    by_tag: tuple[tuple[int, frozenset[int]], ...] = ()

    def of(self, tag: int) -> frozenset[int]:
        for t, keep in self.by_tag:
            if t == tag:
                return keep
        return self.default


class Unit:
    """One compile (or partial) unit: where it lies, its sizes, its abbreviations."""

    __slots__ = ("abbrevs", "addr_size", "end", "off_size", "plans", "start", "str_base", "top", "version")

    def __init__(self, start: int, end: int, top: int, version: int, off_size: int, addr_size: int) -> None:
        #: Its header's offset, the offset past it, and its first entry's.
        self.start, self.end, self.top = start, end, top
        self.version, self.off_size, self.addr_size = version, off_size, addr_size
        self.abbrevs: dict[int, Abbrev] = {}
        #: Where its string offsets begin (``DW_AT_str_offsets_base``; set by the caller).
        self.str_base = 8 if version >= 5 else 0
        self.plans: dict[tuple[int, int], _Plan] = {}


class Dwarf:
    """The debug info of one ELF file (no units when it has none)."""

    def __init__(self, elf: Elf) -> None:
        found = elf.sections_named(*_SECTIONS)
        self.order = "<" if elf.order == 1 else ">"
        self._byteorder: Final = "little" if elf.order == 1 else "big"
        self.info, self.abbrev, self.strs, self.line_strs, self.str_offsets = (
            _section_bytes(elf, found.get(name)) for name in _SECTIONS
        )
        self.units: list[Unit] = []
        self._starts: list[int] = []
        self._tables: dict[int, dict[int, Abbrev]] = {}
        if self.info and self.abbrev:
            self._read_units()

    # -- primitives --------------------------------------------------------------
    @staticmethod
    def uleb(data: bytes, pos: int) -> tuple[int, int]:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift = byte & 0x7F, 7
        while True:
            pos += 1
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if shift > 63:
                raise DwarfError(f"a LEB128 number at {pos:#x} is too long")

    def sleb(self, data: bytes, pos: int) -> tuple[int, int]:
        start = pos
        value, pos = self.uleb(data, pos)
        bits = 7 * (pos - start)
        return (value - (1 << bits) if value >> (bits - 1) & 1 else value), pos

    @staticmethod
    def cstr(data: bytes, start: int) -> str:
        stop = data.find(b"\0", start) if 0 <= start < len(data) else -1
        if stop < 0:
            raise DwarfError(f"a string at {start:#x} does not end inside its section")
        return data[start:stop].decode("utf-8", "replace")

    def word(self, data: bytes, pos: int, size: int) -> int:
        if pos + size > len(data):
            raise DwarfError(f"{size} bytes at {pos:#x} lie past the end of the section")
        return int.from_bytes(data[pos : pos + size], self._byteorder)

    # -- units and abbreviations ---------------------------------------------------
    def _read_units(self) -> None:
        info, pos = self.info, 0
        while pos + 11 <= len(info):
            length, off_size, head = self.word(info, pos, 4), 4, pos + 4
            if length == 0xFFFFFFFF:
                length, off_size, head = self.word(info, pos + 4, 8), 8, pos + 12
            elif length >= 0xFFFFFFF0:
                raise DwarfError(f"the unit at {pos:#x} has a reserved length")
            end = head + length
            if end > len(info) or length < 2:
                raise DwarfError(f"the unit at {pos:#x} runs past the end of .debug_info")
            version = self.word(info, head, 2)
            if version == 5:
                kind, addr_size = info[head + 2], info[head + 3]
                abbrev_at, top = self.word(info, head + 4, off_size), head + 4 + off_size
                top += 8 if kind in (2, 4, 5, 6) else 0  # a type signature or a dwo id
                top += off_size if kind in (2, 6) else 0  # a type offset
            elif 2 <= version <= 4:
                abbrev_at, addr_size = self.word(info, head + 2, off_size), info[head + 2 + off_size]
                top, kind = head + 3 + off_size, 1
            else:
                kind = 0  # a version this reader does not know: its unit is skipped
            if kind in (1, 3) and top < end:  # compile and partial units hold the functions
                unit = Unit(pos, end, top, version, off_size, addr_size)
                unit.abbrevs = self._table(abbrev_at)
                self.units.append(unit)
                self._starts.append(pos)
            pos = end

    def _table(self, at: int) -> dict[int, Abbrev]:
        found = self._tables.get(at)
        if found is None:
            key = (self.abbrev, at)
            found = _TABLES.get(key)
            if found is None:
                if len(_TABLES) >= _MAX_TABLES:
                    _TABLES.clear()
                found = _TABLES[key] = self._read_table(at)
            self._tables[at] = found
        return found

    def _read_table(self, at: int) -> dict[int, Abbrev]:
        data, pos, out = self.abbrev, at, {}
        while True:
            code, pos = self.uleb(data, pos)
            if code == 0:
                break
            tag, pos = self.uleb(data, pos)
            children = data[pos] == 1
            pos += 1
            specs = []
            while True:
                name, pos = self.uleb(data, pos)
                form, pos = self.uleb(data, pos)
                if name == 0 and form == 0:
                    break
                implicit = 0
                if form == 0x21:  # implicit_const: the value is in the table
                    implicit, pos = self.sleb(data, pos)
                specs.append((name, form, implicit))
            out[code] = (tag, children, tuple(specs))
        return out

    def unit_of(self, offset: int) -> Unit:
        """The unit an offset into ``.debug_info`` lies in."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset >= self.units[i].end:
            raise DwarfError(f"a reference to {offset:#x} leads out of every unit")
        return self.units[i]

    # -- entries -----------------------------------------------------------------------
    def entry(self, unit: Unit, pos: int, keep: Keep) -> tuple[int, bool, Attrs, int]:
        """``(tag, has_children, attrs, next)`` of the entry at ``pos`` (tag 0: a null entry)."""
        if pos >= unit.end:
            raise DwarfError(f"an entry at {pos:#x} lies past the end of its unit")
        code, pos = self.uleb(self.info, pos)
        if code == 0:
            return 0, False, {}, pos
        abbrev = unit.abbrevs.get(code)
        if abbrev is None:
            raise DwarfError(f"abbreviation {code} is not in its unit's table")
        tag, children, specs = abbrev
        plan = unit.plans.get((code, id(keep)))  # (Keeps are module constants: their ids stand)
        if plan is None:
            plan = unit.plans[code, id(keep)] = self._plan(unit, specs, keep.of(tag))
        attrs: Attrs = {}
        data = self.info
        for layout, items in plan:
            if layout is None:
                name, form, implicit, _ = items[0]
                value, pos = self._value(unit, form, pos, implicit, name >= 0)
                if name >= 0:
                    attrs[name] = value
                continue
            if pos + layout.size > unit.end:
                raise DwarfError(f"an entry runs past the end of the unit at {unit.start:#x}")
            if items:
                raw = layout.unpack_from(data, pos)
                for name, form, index, implicit in items:
                    attrs[name] = self._convert(unit, form, raw[index] if index >= 0 else implicit)
            pos += layout.size
        return tag, children, attrs, pos

    def skip_children(self, unit: Unit, pos: int, keep: Keep) -> int:
        """The offset after the children that start at ``pos`` and their null entry
        (``keep`` must keep siblings: it is how subtrees are jumped over)."""
        depth = 1
        while depth:
            tag, children, attrs, pos = self.entry(unit, pos, keep)
            if tag == 0:
                depth -= 1
            elif children:
                sibling = attrs.get(AT_SIBLING)
                if isinstance(sibling, tuple) and sibling[0] == "ref" and pos <= sibling[1] <= unit.end:
                    pos = sibling[1]
                else:
                    depth += 1
        return pos

    def _plan(self, unit: Unit, specs: tuple[tuple[int, int, int], ...], keep: frozenset[int]) -> _Plan:
        """How to read an entry of these attributes in ``unit``, keeping those in ``keep``:
        runs of fixed-size values in one ``struct`` call each, any other value by itself."""
        shape = (specs, keep, unit.off_size, unit.addr_size, self.order)
        known = _PLANS.get(shape)
        if known is not None:
            return known
        steps: list[tuple[struct.Struct | None, tuple[tuple[int, int, int, int], ...]]] = []
        items: list[tuple[int, int, int, int]] = []
        fmt, index = "", 0
        for name, form, implicit in specs:
            fixed = _FIXED.get(form, 0 if form == 0x21 else None)
            if fixed is None:
                if fmt or items:
                    steps.append((struct.Struct(self.order + fmt), tuple(items)))
                    fmt, items, index = "", [], 0
                steps.append((None, ((name if name in keep else -1, form, implicit, 0),)))
                continue
            width = unit.off_size if fixed == -1 else unit.addr_size if fixed == -2 else fixed
            if width:
                fmt += _STRUCT_CODES.get(width, f"{width}s")
            if name in keep:
                items.append((name, form, index if width else -1, implicit))
            index += 1 if width else 0
        if fmt or items:
            steps.append((struct.Struct(self.order + fmt), tuple(items)))
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[shape] = tuple(steps)
        return plan

    def _convert(self, unit: Unit, form: int, raw: object) -> object:
        """A fixed-size value as ``entry`` keeps it."""
        if isinstance(raw, bytes):
            raw = int.from_bytes(raw, self._byteorder)
        assert isinstance(raw, int)
        if form in _REF_FORMS:
            return ("ref", unit.start + raw)
        if form == 0x19:  # flag_present
            return True
        if form == 0x0E:
            return self.cstr(self.strs, raw)
        if form == 0x1F:
            return self.cstr(self.line_strs, raw)
        if form in _STRX:
            return self.cstr(self.strs, self.word(self.str_offsets, unit.str_base + raw * unit.off_size, unit.off_size))
        if form in _FAR:
            return ("far", 0)
        if form in _ADDRX:
            return ("addrx", raw)  # an index into .debug_addr, not an address
        return raw

    def _value(self, unit: Unit, form: int, pos: int, implicit: int, keep: bool) -> tuple[object, int]:
        """A value of any form at ``pos`` (None when not kept) and the offset after it."""
        data = self.info
        fixed = _FIXED.get(form)
        if fixed is not None:
            size = unit.off_size if fixed == -1 else unit.addr_size if fixed == -2 else fixed
            return (self._convert(unit, form, self.word(data, pos, size)) if keep else None), pos + size
        if form == 0x10:  # ref_addr: from the section's start; DWARF 2: the address size
            size = unit.addr_size if unit.version == 2 else unit.off_size
            return ("ref", self.word(data, pos, size)), pos + size
        if form in _ULEB_FORMS:
            value, pos = self.sleb(data, pos) if form == 0x0D else self.uleb(data, pos)
            return (self._convert(unit, form, value) if keep else None), pos
        if form == 0x08:  # an inline string
            stop = data.find(b"\0", pos, unit.end)
            if stop < 0:
                raise DwarfError(f"an inline string at {pos:#x} does not end inside its unit")
            return (data[pos:stop].decode("utf-8", "replace") if keep else None), stop + 1
        length_size = _BLOCK_FORMS.get(form)
        if length_size is not None:
            if length_size:
                size, pos = self.word(data, pos, length_size), pos + length_size
            else:
                size, pos = self.uleb(data, pos)
            return None, pos + size
        if form == 0x21:
            return implicit, pos
        if form == 0x16:  # indirect: the form comes first
            real, pos = self.uleb(data, pos)
            if real == 0x16:
                raise DwarfError("an indirect form names itself")
            return self._value(unit, real, pos, implicit, keep)
        raise DwarfError(f"unknown form {form:#x}")


def _section_bytes(elf: Elf, section: Section | None) -> bytes:
    if section is None:
        return b""
    data = elf.section_data(section)
    if not section.flags & 0x800:  # SHF_COMPRESSED
        return data
    header = struct.Struct(("<" if elf.order == 1 else ">") + ("IIQQ" if elf.layout.is64 else "III"))
    if len(data) < header.size:
        raise DwarfError(f"{section.name}: truncated compression header")
    fields = header.unpack_from(data)
    kind, size = fields[0], fields[2 if elf.layout.is64 else 1]
    if kind != 1:  # ELFCOMPRESS_ZLIB (zstd takes a module this reader does without)
        return b""
    if size > _MAX_INFLATED:
        raise DwarfError(f"{section.name}: claims to inflate to {size} bytes")
    try:
        out = zlib.decompressobj().decompress(data[header.size :], size + 1)
    except zlib.error as exc:
        raise DwarfError(f"{section.name}: {exc}") from None
    if len(out) != size:
        raise DwarfError(f"{section.name}: inflates to {len(out)} bytes, not {size}")
    return out
