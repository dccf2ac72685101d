"""What a shared object makes the dynamic loader run when ``dlopen`` maps it.

A host kernel is loaded into the caller's process. Calling one of its functions
runs the tenant's code, by design; *loading* it must not: ``compile()`` loads
every kernel it builds, and a constructor would run there, before the caller has
asked for anything. glibc's ``dlopen`` runs code of the object's own in these
places (``elf/dl-open.c``, ``dl-reloc.c``, ``dl-init.c``, ``dl-load.c``):

* ``DT_INIT`` and each ``DT_INIT_ARRAY`` entry (``DT_FINI``/``DT_FINI_ARRAY`` at
  unload or exit); ``DT_PREINIT_ARRAY`` for executables;
* the resolver of each GNU IFUNC (``R_*_IRELATIVE``, or a relocation against an
  ``STT_GNU_IFUNC`` symbol), with ``RTLD_NOW`` all of them;
* whatever the toolchain's own start-up code calls: ``_init`` calls
  ``__gmon_start__`` and ``__do_global_dtors_aux`` calls ``__cxa_finalize`` if
  something defines them; a kernel that defines one of them (even hidden) runs it;
* relocations, which write where they say: one that overwrites an initialiser
  slot or a GOT entry the start-up code calls through redirects that call.

and it widens the whole process on behalf of the object: an executable stack (a
``PT_GNU_STACK`` with ``PF_X``, or none), text relocations, search paths and
auditors (``DT_RPATH``, ``DT_RUNPATH``, ``DT_AUDIT``, ``DT_DEPAUDIT``,
``DT_FILTER``, ``DT_AUXILIARY``, a ``DT_NEEDED`` with a ``/``), and a
``DT_SONAME`` (a later ``dlopen`` of a library by that name gets this object).

:func:`load_time_code` reads the object as the loader does (program headers, the
dynamic table up to ``DT_NULL``, relocations through the addresses they are
mapped at) and names everything beyond :func:`baseline_of` the toolchain's own
empty link. The toolchain's crt files always take part (``-nostartfiles`` is no
allowed flag), so any initialiser of the kernel's is one entry more than theirs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ..spec import LoadBaseline
from ._elf import PT_GNU_STACK, PT_LOAD, SHT_DYNSYM, SHT_PROGBITS, Elf, ElfError

__all__ = ["baseline_of", "load_time_code"]

_ET_DYN: Final = 3
_PF_X: Final = 1
_PF_W: Final = 2
_STT_GNU_IFUNC: Final = 10
_STB_GNU_UNIQUE: Final = 10

# Dynamic tags.
_DT_NEEDED, _DT_PLTRELSZ, _DT_STRTAB, _DT_RELA, _DT_RELASZ, _DT_RELAENT = 1, 2, 5, 7, 8, 9
_DT_STRSZ, _DT_INIT, _DT_FINI, _DT_SONAME, _DT_RPATH = 10, 12, 13, 14, 15
_DT_REL, _DT_RELSZ, _DT_RELENT, _DT_PLTREL, _DT_TEXTREL, _DT_JMPREL = 17, 18, 19, 20, 22, 23
_DT_INIT_ARRAY, _DT_FINI_ARRAY, _DT_INIT_ARRAYSZ, _DT_FINI_ARRAYSZ = 25, 26, 27, 28
_DT_RUNPATH, _DT_FLAGS, _DT_PREINIT_ARRAY, _DT_PREINIT_ARRAYSZ = 29, 30, 32, 33
_DT_RELRSZ, _DT_RELR = 35, 36
_DF_TEXTREL: Final = 4

#: Tags whose mere presence is refused, and why.
_REFUSED_TAGS: Final = {
    _DT_PREINIT_ARRAY: "a pre-initialiser array (DT_PREINIT_ARRAY)",
    _DT_PREINIT_ARRAYSZ: "a pre-initialiser array (DT_PREINIT_ARRAYSZ)",
    _DT_TEXTREL: "text relocations (DT_TEXTREL): the loader makes its code writable",
    _DT_RPATH: "a library search path (DT_RPATH) for what it loads",
    _DT_RUNPATH: "a library search path (DT_RUNPATH) for what it loads",
    _DT_SONAME: "a name (DT_SONAME): a later load of a library by that name would get this object",
    0x6FFFFEFC: "an auditor (DT_AUDIT)",
    0x6FFFFEFB: "an auditor for its dependencies (DT_DEPAUDIT)",
    0x7FFFFFFF: "a filter library (DT_FILTER) loaded in its place",
    0x7FFFFFFD: "an auxiliary filter library (DT_AUXILIARY)",
}

#: ``R_*_IRELATIVE`` by ``e_machine``: the loader calls the resolver the addend names.
_IRELATIVE: Final = {3: 42, 62: 37, 183: 1032, 40: 160, 20: 248, 21: 248, 22: 61, 243: 58, 258: 12, 43: 249, 2: 249}
#: More dynamic relocations than this is no kernel (RELR packs 63 in a word: the
#: bound keeps a crafted table from expanding into gigabytes).
_MAX_RELOCATIONS: Final = 1 << 22
#: Relocations that write more than a word (TLS descriptors), by ``e_machine``.
_TWO_WORDS: Final = {62: 36, 183: 1031}


def baseline_of(empty_link: bytes) -> LoadBaseline:
    """What the toolchain's empty shared object (``cc -shared /dev/null``) holds that
    runs at load or unload. Raises :class:`ElfError` for bytes it cannot read."""
    elf = Elf(empty_link)
    entries = elf.dynamic()
    if entries is None:
        raise ElfError("the empty link has no dynamic table")
    tags = dict(entries)

    def size_of(name: str) -> int:
        section = elf.section(name)
        return section.size if section is not None else 0

    word = elf.layout.word
    dynsym = next((s for s in elf.sections() if s.type == SHT_DYNSYM), None)
    refs = [] if dynsym is None else [s.name for s in elf.symbols(dynsym) if s.shndx == 0 and s.name]
    return LoadBaseline(
        elf_class=elf.elf_class,
        byte_order=elf.order,
        machine=elf.machine,
        init=size_of(".init") if _DT_INIT in tags else -1,
        fini=size_of(".fini") if _DT_FINI in tags else -1,
        init_array=tags.get(_DT_INIT_ARRAYSZ, 0) // word,
        fini_array=tags.get(_DT_FINI_ARRAYSZ, 0) // word,
        ctors=size_of(".ctors"),
        dtors=size_of(".dtors"),
        startup_refs=tuple(sorted(set(refs))),
    )


def load_time_code(artifact: bytes, baseline: LoadBaseline) -> list[str]:
    """Why loading ``artifact`` would run code of its own, or change the process
    for it, beyond what ``baseline`` (the toolchain's empty link) does: one reason
    per finding, none for an object that is safe to load. Raises :class:`ElfError`
    for bytes it cannot read."""
    elf = Elf(artifact)
    if (elf.elf_class, elf.order, elf.machine) != (baseline.elf_class, baseline.byte_order, baseline.machine):
        return [
            f"it is an ELF file for another machine (class {elf.elf_class}, data {elf.order}, "
            f"machine {elf.machine}) than the toolchain links"
        ]
    reasons: list[str] = []
    if elf.type != _ET_DYN:
        reasons.append(f"it is no shared object (e_type {elf.type})")
    stack = [s for s in elf.segments() if s.type == PT_GNU_STACK]
    if not stack:
        reasons.append("it has no PT_GNU_STACK: loading it would make every thread's stack executable")
    elif any(s.flags & _PF_X for s in stack):
        reasons.append("it asks for an executable stack (PT_GNU_STACK with PF_X)")
    entries = elf.dynamic()
    if entries is None:
        return [*reasons, "it has no dynamic table (PT_DYNAMIC)"]
    tags: dict[int, int] = {}
    for tag, value in entries:
        if tag in tags and tag != _DT_NEEDED:
            reasons.append(f"its dynamic table holds tag {tag:#x} twice")
        tags[tag] = value
        refused = _REFUSED_TAGS.get(tag)
        if refused is not None:
            reasons.append(f"it has {refused}")
    if tags.get(_DT_FLAGS, 0) & _DF_TEXTREL:
        reasons.append("it has text relocations (DF_TEXTREL): the loader makes its code writable")
    reasons += _needed(elf, entries, tags)
    reasons += _initialisers(elf, tags, baseline)
    reasons += _symbols(elf, baseline)
    reasons += _relocations(elf, tags)
    return list(dict.fromkeys(reasons))


def _needed(elf: Elf, entries: list[tuple[int, int]], tags: dict[int, int]) -> list[str]:
    needed = [v for t, v in entries if t == _DT_NEEDED]
    if not needed:
        return []
    if _DT_STRTAB not in tags or _DT_STRSZ not in tags:
        return ["it names libraries (DT_NEEDED) without a string table"]
    strtab = elf.at(tags[_DT_STRTAB], tags[_DT_STRSZ])
    out = []
    for offset in needed:
        stop = strtab.find(b"\0", offset)
        if stop < 0:
            raise ElfError("a DT_NEEDED name does not end inside the string table")
        name = strtab[offset:stop]
        if b"/" in name:
            out.append(f"it loads a library by path (DT_NEEDED {name.decode('utf-8', 'replace')!r})")
    return out


def _initialisers(elf: Elf, tags: dict[int, int], baseline: LoadBaseline) -> list[str]:
    out = []
    word = elf.layout.word
    # (of another type, .init is not found and DT_INIT is refused; .ctors is no table)
    sections = elf.sections_named(".init", ".fini", ".ctors", ".dtors", sh_type=SHT_PROGBITS)
    for tag, name, want in ((_DT_INIT, ".init", baseline.init), (_DT_FINI, ".fini", baseline.fini)):
        if tag not in tags:
            continue
        fn = "_init" if tag == _DT_INIT else "_fini"
        section = sections.get(name)
        if want < 0:
            out.append(f"it has a {fn} function (DT_{name[1:].upper()}); the toolchain's own link has none")
        elif section is None or section.addr != tags[tag]:
            out.append(f"its DT_{name[1:].upper()} calls {tags[tag]:#x}, not the toolchain's {fn} ({name})")
        elif section.size != want:
            out.append(
                f"its {fn} ({name}) is {section.size} bytes where the toolchain's is {want}: code was added to it"
            )
    for size_tag, what, want in (
        (_DT_INIT_ARRAYSZ, "initialisers (DT_INIT_ARRAY)", baseline.init_array),
        (_DT_FINI_ARRAYSZ, "finalisers (DT_FINI_ARRAY)", baseline.fini_array),
    ):
        count = tags.get(size_tag, 0) // word
        if count > want:
            out.append(
                f"it has {count} {what} where the toolchain's own link has {want}: a constructor or "
                "destructor, a C++ static initialiser or an .init_array entry of the source's"
            )
    for name, want in ((".ctors", baseline.ctors), (".dtors", baseline.dtors)):
        section = sections.get(name)
        if section is not None and section.size > want:
            out.append(f"it has {name} entries ({section.size} bytes; the toolchain's own: {want})")
    return out


def _symbols(elf: Elf, baseline: LoadBaseline) -> list[str]:
    out = []
    undefined: set[bytes] = set()
    i_info, i_shndx, _, _ = elf.layout.sym_fields
    data = elf.data
    for section in elf.of_type(SHT_DYNSYM):
        s_base, s_end = elf.string_table(section.link)
        rows = list(elf.symbol_rows(section))
        for row in rows:
            if row[i_shndx] == 0:
                # (compared as bytes: undefined names are few and never decoded)
                start = s_base + row[0]
                stop = data.find(b"\0", start, s_end) if start < s_end else -1
                if stop < 0:
                    raise ElfError("a symbol name does not end inside its string table")
                undefined.add(data[start:stop])
        out += [
            f"it has a GNU IFUNC ({elf.symbol_name(section, row)!r}): the loader runs its resolver"
            for row in rows
            if row[i_info] & 0xF == _STT_GNU_IFUNC and row[i_shndx] != 0
        ]
        out += [
            f"it defines {elf.symbol_name(section, row)!r} as STB_GNU_UNIQUE: the loader binds it for the "
            "whole process to the first library that defined it, and a rebuilt kernel would use an earlier "
            "build's (a static of an inline function or template: build what defines it with -fno-gnu-unique)"
            for row in rows
            if row[i_info] >> 4 == _STB_GNU_UNIQUE and row[i_shndx] != 0
        ]
    out += [
        f"it defines {name!r}, which the toolchain's start-up code calls at load or unload if something defines it"
        for name in baseline.startup_refs
        if name.encode() not in undefined
    ]
    return out


def _relocations(elf: Elf, tags: dict[int, int]) -> list[str]:
    """Every dynamic relocation must write inside a writable segment, no two may write
    the same bytes (a second one would redirect an initialiser or a GOT entry the
    start-up code calls through), and none may be an IRELATIVE."""
    word = elf.layout.word
    relocs = _relocs(elf, tags)
    if not relocs:
        return []
    out = []
    types = {t for _, t in relocs}
    if _IRELATIVE.get(elf.machine, -1) in types:
        out.append("it has an IRELATIVE relocation: the loader runs its GNU IFUNC resolver")
    wide = _TWO_WORDS.get(elf.machine, -1)
    # (every write is taken as a word at least: a narrower one inside a pointer is an overlap)
    spans = sorted((w, w + (2 * word if t == wide else word)) for w, t in relocs)
    if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
        out.append("two of its relocations write the same bytes")
    writable = sorted((s.vaddr, s.vaddr + s.memsz) for s in elf.segments() if s.type == PT_LOAD and s.flags & _PF_W)
    segment = 0
    for where, end in spans:  # (both sorted: one pass)
        while segment < len(writable) and writable[segment][1] <= where:
            segment += 1
        if segment == len(writable) or not writable[segment][0] <= where < end <= writable[segment][1]:
            out.append(f"a relocation writes at {where:#x}, outside the object's writable segments")
            break
    return out


def _relocs(elf: Elf, tags: dict[int, int]) -> list[tuple[int, int]]:
    """``(offset, type)`` of each dynamic relocation the loader applies (RELR's have
    type -1: all relative), from the tables as glibc finds them."""
    layout = elf.layout
    tables: list[tuple[int, int, bool]] = []  # address, size, with addend
    if tags.get(_DT_RELAENT, layout.rela.size) != layout.rela.size:
        raise ElfError("DT_RELAENT is not the size of a relocation")
    if tags.get(_DT_RELENT, layout.rel.size) != layout.rel.size:
        raise ElfError("DT_RELENT is not the size of a relocation")
    sizes = {_DT_RELA: tags.get(_DT_RELASZ, 0), _DT_REL: tags.get(_DT_RELSZ, 0)}
    plt = tags.get(_DT_PLTREL)
    if _DT_JMPREL in tags and plt in sizes:
        assert plt is not None
        start, size = tags[_DT_JMPREL], tags.get(_DT_PLTRELSZ, 0)
        # (glibc: a table that ends where the PLT's ends holds it; it is applied once)
        if plt in tags and tags[plt] + sizes[plt] == start + size:
            sizes[plt] -= size
        tables.append((start, size, plt == _DT_RELA))
    for kind, size in sizes.items():
        if kind in tags:
            tables.append((tags[kind], size, kind == _DT_RELA))
    mask = 0xFFFFFFFF if layout.is64 else 0xFF
    out: list[tuple[int, int]] = []
    for address, size, addend in tables:
        row = layout.rela if addend else layout.rel
        if size % row.size:
            raise ElfError("a relocation table's size is not a whole number of entries")
        if len(out) + size // row.size > _MAX_RELOCATIONS:
            raise ElfError(f"more than {_MAX_RELOCATIONS} dynamic relocations")
        out += [(f[0], f[1] & mask) for f in row.iter_unpack(elf.at(address, size))]
    if _DT_RELR in tags:
        out += [(where, -1) for where in _relr(elf, tags[_DT_RELR], tags.get(_DT_RELRSZ, 0))]
    return out


def _relr(elf: Elf, address: int, size: int) -> Iterator[int]:
    """The offsets a ``DT_RELR`` table relocates: an address, then bitmaps of the
    words after it."""
    word, row = elf.layout.word, elf.layout.addr
    if size % word:
        raise ElfError("DT_RELRSZ is not a whole number of words")
    where = count = 0
    bits = word * 8 - 1
    for (entry,) in row.iter_unpack(elf.at(address, size)):
        if not entry & 1:
            yield entry
            where = entry + word
            count += 1
            continue
        for i in range(bits):
            if entry >> (i + 1) & 1:
                yield where + i * word
        where += bits * word
        count += bits
        if count > _MAX_RELOCATIONS:
            raise ElfError(f"more than {_MAX_RELOCATIONS} dynamic relocations")
