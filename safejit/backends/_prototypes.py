"""The C prototypes of a shared object's exported functions, from its DWARF (``-g``).

For each wanted function: its return type, its parameters' names and types, and
whether it takes ``...``, as the compiler saw the definition. A definition is found
by its address (``DW_AT_low_pc`` = the symbol's value), else by its linkage name or
name; the top of each unit is read first (gcc puts every definition there) and
namespaces only for names still missing (clang defines inside them)::

    from safejit.backends import _prototypes

    _prototypes.prototypes(so_bytes, {"add"})
    # {'add': Prototype(ret=('i4', 'int'), params=(('a', 'i4', 'int'), ('b', 'i4', 'int')), varargs=False)}

A type is ``(code, spelling)``; the code is what a call checks (``safejit._hostcall``):
``v`` void, ``b`` bool, ``i1``..``i8``/``u1``..``u8`` integers by size, ``ci1``/``cu1``
plain ``char``, ``f4``/``f8`` float/double, ``f<size>`` long double, ``f2`` _Float16
(pointee only); ``p:<pointee>`` a pointer, ``pc:<pointee>`` one to const, the pointee
a scalar code, ``v``, ``p`` (another pointer) or ``s<size>`` (a struct, union or
class of that size; 0: unknown); ``!<why>`` a type a call cannot check (a struct
passed by value, a function pointer, a reference, ``__int128``, ...). A function the
debug info does not describe is left out.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, NamedTuple

from ._dwarf import AT_SIBLING, TAG_SUBPROGRAM, Attrs, Dwarf, DwarfError, Keep, Unit
from ._elf import SHT_DYNSYM, Elf, ElfError

__all__ = ["Prototype", "prototypes"]

_TAG_ARRAY, _TAG_CLASS, _TAG_ENUM, _TAG_PARAM, _TAG_POINTER, _TAG_REFERENCE = 0x01, 0x02, 0x04, 0x05, 0x0F, 0x10
_TAG_CU, _TAG_STRUCT, _TAG_SUBROUTINE, _TAG_TYPEDEF, _TAG_UNION, _TAG_VARARGS = 0x11, 0x13, 0x15, 0x16, 0x17, 0x18
_TAG_PTR_TO_MEMBER, _TAG_BASE, _TAG_CONST, _TAG_VOLATILE, _TAG_RESTRICT = 0x1F, 0x24, 0x26, 0x35, 0x37
_TAG_NAMESPACE, _TAG_UNSPECIFIED, _TAG_PARTIAL, _TAG_RVALUE_REF, _TAG_ATOMIC = 0x39, 0x3B, 0x3C, 0x42, 0x47
_AT_NAME, _AT_BYTE_SIZE, _AT_LOW_PC, _AT_LANGUAGE, _AT_PROTOTYPED, _AT_ORIGIN = 0x03, 0x0B, 0x11, 0x13, 0x27, 0x31
_AT_ENCODING, _AT_SPECIFICATION, _AT_TYPE, _AT_RANGES, _AT_LINKAGE, _AT_STR_OFFSETS = 0x3E, 0x47, 0x49, 0x55, 0x6E, 0x72
_AT_MIPS_LINKAGE, _AT_GNU_VECTOR, _AT_DECLARATION = 0x2007, 0x2107, 0x3C
_ATE_BOOL, _ATE_FLOAT, _ATE_SIGNED, _ATE_SCHAR, _ATE_UNSIGNED, _ATE_UCHAR, _ATE_UTF = 2, 4, 5, 6, 7, 8, 0x10
_STT_FUNC: Final = 2
#: Languages where a definition may lack a prototype (C89, C, C99, C11, C17).
_C_LANGUAGES: Final = frozenset({0x01, 0x02, 0x0C, 0x1D, 0x2C})
#: What a call of a function without a prototype promotes (to int or double).
_PROMOTED: Final = frozenset({"f4", "b", "i1", "u1", "ci1", "cu1", "i2", "u2"})
#: Deeper than this, a namespace nesting or a chain of types or origins is no compiler's.
_MAX_DEPTH: Final = 64

_ALL: Final = frozenset(
    {AT_SIBLING, _AT_NAME, _AT_BYTE_SIZE, _AT_LOW_PC, _AT_LANGUAGE, _AT_PROTOTYPED, _AT_ORIGIN, _AT_ENCODING,
     _AT_SPECIFICATION, _AT_TYPE, _AT_RANGES, _AT_LINKAGE, _AT_STR_OFFSETS, _AT_MIPS_LINKAGE, _AT_GNU_VECTOR,
     _AT_DECLARATION}
)  # fmt: skip
#: A unit's own entry: read before its string offsets are known, so no string.
_UNIT: Final = Keep(frozenset({_AT_LANGUAGE, _AT_STR_OFFSETS}))
#: Entries read whole (types, parameters, the subprograms that match).
_FULL: Final = Keep(_ALL)
#: A scan's read: of a subprogram whether (and where) it defines code, of anything else its sibling.
_SCAN: Final = Keep(
    frozenset({AT_SIBLING}), ((TAG_SUBPROGRAM, frozenset({AT_SIBLING, _AT_LOW_PC, _AT_RANGES, _AT_DECLARATION})),)
)

Found = dict[str, tuple[Unit, Attrs, int]]


class Prototype(NamedTuple):
    #: ``(code, spelling)`` of the return type.
    ret: tuple[str, str]
    #: ``(name, code, spelling)`` of each parameter; the name is "" when not recorded.
    params: tuple[tuple[str, str, str], ...]
    varargs: bool


def prototypes(data: bytes | Elf, names: Collection[str]) -> dict[str, Prototype]:
    """The prototypes of the exported functions ``names`` that the debug info
    describes (none without debug info). Raises :class:`DwarfError` for debug info it
    cannot read."""
    try:
        elf = data if isinstance(data, Elf) else Elf(data)
        dwarf = Dwarf(elf)
        if not dwarf.units or not names:
            return {}
        reader = _Reader(dwarf)
        found = reader.find(names, _addresses(elf, names))
        return {name: reader.prototype(unit, attrs, child) for name, (unit, attrs, child) in found.items()}
    except (IndexError, ElfError, RecursionError) as exc:
        raise DwarfError(f"the debug info cannot be read: {exc}") from None


def _addresses(elf: Elf, names: Collection[str]) -> dict[int, list[str]]:
    """The wanted names among the functions the dynamic symbol table defines, by address."""
    at: dict[int, list[str]] = {}
    for table in elf.of_type(SHT_DYNSYM):
        for sym in elf.symbols(table):
            if sym.type == _STT_FUNC and sym.shndx != 0 and sym.name in names:
                at.setdefault(sym.value, []).append(sym.name)
    return at


def _ref(value: object) -> int | None:
    """The offset a reference holds (None: not one this reader follows)."""
    if isinstance(value, tuple) and value[0] == "ref" and isinstance(value[1], int):
        return value[1]
    return None


class _Reader:
    def __init__(self, dwarf: Dwarf) -> None:
        self.dwarf = dwarf
        self.types: dict[int, tuple[str, str, bool]] = {}
        self.c_units: set[int] = set()

    # -- finding definitions -----------------------------------------------------------
    def find(self, wanted: Collection[str], at: dict[int, list[str]]) -> Found:
        """``name -> (unit, attrs, first child or -1)`` of each wanted function's definition."""
        found: Found = {}
        tops = []
        for unit in self.dwarf.units:
            tag, children, attrs, pos = self.dwarf.entry(unit, unit.top, _UNIT)
            if tag not in (_TAG_CU, _TAG_PARTIAL) or not children:
                continue
            if isinstance(attrs.get(_AT_STR_OFFSETS), int):
                unit.str_base = attrs[_AT_STR_OFFSETS]  # type: ignore[assignment]
            if attrs.get(_AT_LANGUAGE) in _C_LANGUAGES:
                self.c_units.add(unit.start)
            tops.append((unit, pos))
        # The tops; then namespaces; then, for names still missing, an entry without code
        # of its own (gcc folds a function whose code is another's into it: its entry
        # keeps the prototype, the other's the address).
        for limit, loose in ((0, False), (_MAX_DEPTH, False), (_MAX_DEPTH, True)):
            for unit, pos in tops:
                self._scan(unit, pos, (wanted, at, found), 0, limit, loose)
            if len(found) == len(wanted):
                break
        return found

    def _scan(
        self,
        unit: Unit,
        pos: int,
        search: tuple[Collection[str], dict[int, list[str]], Found],
        depth: int,
        limit: int,
        loose: bool,
    ) -> int:
        """Look for definitions among the entries from ``pos`` to their null entry (into
        namespaces down to ``limit`` levels); the offset after it. A definition is one
        with code (``DW_AT_low_pc``, ``DW_AT_ranges``), or (``loose``) any that is no
        mere declaration; it matches by its linkage name or name, which an address that
        is a wanted function's (the cheap test, before any name is read) must confirm:
        another function's code may be at that address."""
        wanted, at, found = search
        while True:
            start = pos
            tag, children, attrs, pos = self.dwarf.entry(unit, pos, _SCAN)
            if tag == 0:
                return pos
            if tag == TAG_SUBPROGRAM:
                low = attrs.get(_AT_LOW_PC)
                coded = _AT_LOW_PC in attrs or _AT_RANGES in attrs
                if (isinstance(low, int) and low in at) or (not isinstance(low, int) and coded) or (
                    loose and not coded and not attrs.get(_AT_DECLARATION)
                ):  # fmt: skip
                    full = self.dwarf.entry(unit, start, _FULL)[2]
                    name = self._export_name(full)
                    confirmed = not isinstance(low, int) or name in at[low]
                    if name is not None and confirmed and name in wanted and name not in found:
                        found[name] = (unit, full, pos if children else -1)
            if not children:
                continue
            if tag == _TAG_NAMESPACE and depth < limit:
                pos = self._scan(unit, pos, search, depth + 1, limit, loose)
            else:
                pos = self._past(unit, attrs, pos)

    def _past(self, unit: Unit, attrs: Attrs, pos: int) -> int:
        """Past the children (from ``pos``) of the entry ``attrs``: by its sibling when
        that is sound, else by reading them."""
        sibling = _ref(attrs.get(AT_SIBLING))
        if sibling is not None and pos <= sibling <= unit.end:
            return sibling
        return self.dwarf.skip_children(unit, pos, _SCAN)

    def _export_name(self, attrs: Attrs) -> str | None:
        """The symbol a subprogram defines: its linkage name, else its name (C, extern
        "C"), looked for through its specification or abstract origin."""
        name = None
        for _, more, _ in self._chain(None, attrs, -1):
            linkage = more.get(_AT_LINKAGE, more.get(_AT_MIPS_LINKAGE))
            if isinstance(linkage, str):
                return linkage
            if name is None and isinstance(more.get(_AT_NAME), str):
                name = more[_AT_NAME]
        return name  # type: ignore[return-value]

    def _chain(self, unit: Unit | None, attrs: Attrs, child: int) -> list[tuple[Unit | None, Attrs, int]]:
        """The entry and those it completes (abstract origin, specification), in order,
        each with where its children begin (-1: none)."""
        out = [(unit, attrs, child)]
        for _ in range(_MAX_DEPTH):
            ref = _ref(attrs.get(_AT_ORIGIN, attrs.get(_AT_SPECIFICATION)))
            if ref is None:
                return out
            unit = self.dwarf.unit_of(ref)
            _, children, attrs, pos = self.dwarf.entry(unit, ref, _FULL)
            out.append((unit, attrs, pos if children else -1))
        raise DwarfError("a chain of abstract origins is too long")

    # -- prototypes ---------------------------------------------------------------------
    def prototype(self, unit: Unit, attrs: Attrs, child: int) -> Prototype:
        chain = self._chain(unit, attrs, child)
        merged = _merged(chain)
        ret = self._type_of(merged.get(_AT_TYPE), ret=True)
        k_and_r = unit.start in self.c_units and not merged.get(_AT_PROTOTYPED)
        for p_unit, _, pos in chain:
            if p_unit is not None and pos >= 0:
                params, varargs = self._parameters(p_unit, pos, k_and_r)
                if params or varargs:
                    return Prototype(ret, params, varargs)
        return Prototype(ret, (), False)

    def _parameters(self, unit: Unit, pos: int, k_and_r: bool) -> tuple[tuple[tuple[str, str, str], ...], bool]:
        params: list[tuple[str, str, str]] = []
        varargs = False
        while True:
            tag, children, attrs, pos = self.dwarf.entry(unit, pos, _FULL)
            if tag == 0:
                return tuple(params), varargs
            if tag == _TAG_PARAM:
                merged = _merged(self._chain(unit, attrs, -1)) if _AT_ORIGIN in attrs else attrs
                name = merged.get(_AT_NAME)
                code, spelling = self._type_of(merged.get(_AT_TYPE), ret=False)
                if k_and_r and code in _PROMOTED:
                    code = "!a parameter of a definition without a prototype (promoted when called)"
                params.append((name if isinstance(name, str) else "", code, spelling))
            elif tag == _TAG_VARARGS:
                varargs = True
            if children:
                pos = self._past(unit, attrs, pos)

    # -- types -----------------------------------------------------------------------------
    def _type_of(self, ref: object, *, ret: bool) -> tuple[str, str]:
        """A parameter's (``ret``: a return value's) ``(code, spelling)``."""
        if ref is None:
            return ("v", "void")
        offset = _ref(ref)
        if offset is None:
            return ("!a type this reader cannot follow", "?")
        code, spelling, _ = self._resolve(offset, 0)
        if code.startswith("s"):
            code = "!a struct, union or class passed by value"
        elif code == "F" or code.startswith("A"):
            code = "!a function or array type"
        elif code == "v" and not ret:
            code = "!void"
        return code, spelling

    def _resolve(self, offset: int, depth: int) -> tuple[str, str, bool]:
        """``(code, spelling, const)`` of the type entry at ``offset``; besides the codes
        of the module docstring: a struct ``s<size>``, a function type ``F``, an array
        ``A<element code>``."""
        known = self.types.get(offset)
        if known is not None:
            return known
        if depth > _MAX_DEPTH:
            raise DwarfError("a chain of types is too long")
        self.types[offset] = ("!a type that refers to itself", "?", False)  # (until resolved)
        tag, _, attrs, _ = self.dwarf.entry(self.dwarf.unit_of(offset), offset, _FULL)
        name = attrs.get(_AT_NAME)
        name = name if isinstance(name, str) else ""
        inner = attrs.get(_AT_TYPE)
        if inner is None:
            code, spelling, const = "v", "void", False
        elif (at := _ref(inner)) is not None:
            code, spelling, const = self._resolve(at, depth + 1)
        else:
            code, spelling, const = "!a type this reader cannot follow", "?", False
        out = _type(tag, attrs, name, code, spelling, const)
        self.types[offset] = out
        return out


def _merged(chain: list[tuple[Unit | None, Attrs, int]]) -> Attrs:
    """An entry's attributes over those of the entries it completes."""
    merged: Attrs = {}
    for _, attrs, _ in reversed(chain):
        merged.update(attrs)
    return merged


def _type(tag: int, attrs: Attrs, name: str, code: str, spelling: str, const: bool) -> tuple[str, str, bool]:
    """The ``(code, spelling, const)`` of a type entry whose own type (if any) is
    ``(code, spelling, const)``."""
    if tag == _TAG_BASE:
        return _base_code(attrs, name), name, False
    if tag in (_TAG_TYPEDEF, _TAG_ATOMIC):
        return code, name or spelling, const
    if tag in (_TAG_CONST, _TAG_VOLATILE, _TAG_RESTRICT):
        word = {_TAG_CONST: "const", _TAG_VOLATILE: "volatile", _TAG_RESTRICT: "restrict"}[tag]
        if code.startswith("p"):  # (of the pointer itself: after its star)
            spelled = f"{spelling}{word}" if spelling.endswith("*") else f"{spelling} {word}"
        else:
            spelled = f"{word} {spelling}"
        return code, spelled, const or tag == _TAG_CONST
    if tag == _TAG_POINTER:
        star = f"{spelling}*" if spelling.endswith("*") else f"{spelling} *"
        if code == "F":
            return "!a function pointer", "function pointer", False
        if code.startswith("A"):
            star = f"{spelling.removesuffix('[]')} (*)[]"
        pointee = code[1:] if code.startswith("A") else code  # (a pointer to an array points to its elements)
        if pointee.startswith("p"):
            pointee = "p"
        elif pointee.startswith(("!", "F")) or pointee in ("f10", "f12"):
            pointee = "s0"  # a pointee no array dtype matches: an opaque one
        return f"p{'c' if const else ''}:{pointee}", star, False
    if tag in (_TAG_STRUCT, _TAG_UNION, _TAG_CLASS):
        size = attrs.get(_AT_BYTE_SIZE)
        word = {_TAG_STRUCT: "struct", _TAG_UNION: "union", _TAG_CLASS: "class"}[tag]
        return f"s{size if isinstance(size, int) else 0}", f"{word} {name or '<anonymous>'}", False
    if tag == _TAG_ENUM:
        if _AT_TYPE not in attrs:
            size, signed = attrs.get(_AT_BYTE_SIZE), attrs.get(_AT_ENCODING) != _ATE_UNSIGNED
            code = f"{'i' if signed else 'u'}{size}" if size in (1, 2, 4, 8) else "!an enum of unknown size"
        return code, f"enum {name or '<anonymous>'}", False
    if tag == _TAG_ARRAY:
        if attrs.get(_AT_GNU_VECTOR):
            return "!a vector type", name or "vector", False
        element = code[1:] if code.startswith("A") else code  # (an array of arrays: of their elements)
        element = "p" if element.startswith("p") else "s0" if element.startswith(("!", "F")) else element
        return "A" + element, f"{spelling}[]", const
    if tag == _TAG_SUBROUTINE:
        return "F", "function", False
    if tag in (_TAG_REFERENCE, _TAG_RVALUE_REF):
        return "!a reference", f"{spelling} &", False
    if tag == _TAG_PTR_TO_MEMBER:
        return "!a pointer to member", "pointer to member", False
    if tag == _TAG_UNSPECIFIED:
        return f"!{name or 'an unspecified type'}", name or "?", False
    return "!a type this reader does not know", name or "?", False


def _base_code(attrs: Attrs, name: str) -> str:
    encoding, size = attrs.get(_AT_ENCODING), attrs.get(_AT_BYTE_SIZE)
    if encoding == _ATE_BOOL and size == 1:
        return "b"
    if encoding in (_ATE_SIGNED, _ATE_SCHAR, _ATE_UNSIGNED, _ATE_UCHAR, _ATE_UTF) and size in (1, 2, 4, 8):
        code = f"{'i' if encoding in (_ATE_SIGNED, _ATE_SCHAR) else 'u'}{size}"
        return f"c{code}" if name == "char" else code
    if encoding == _ATE_FLOAT:
        if size in (4, 8):  # float, double, _Float32, _Float64, _Float32x
            return f"f{size}"
        if name in ("long double", "_Float64x") and size in (12, 16):  # the x87 extended format
            return f"f{size}"
        if name == "_Float16" and size == 2:
            return "f2"
    return f"!{name or 'an unknown base type'}"
