"""Hypothesis strategies shared by the property tests.

``build_specs()`` draws coherent, plausible :class:`BuildSpec` values (the
file name follows the language, ``source_digest`` is the hash of ``code``,
``argv`` is assembled the way the host backend assembles it).
``FIELD_STRATEGIES`` holds one strategy per BuildSpec field, and
``different_value(spec, field)`` draws a valid value for one field that is
guaranteed to differ from the spec's current one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import strategies as st

from safejit.closure.anchors import Anchors
from safejit.keys import KEY_SCHEMA, digest_bytes
from safejit.policy.flag_tables import FAMILIES, LINKER, LINKER_NEXT, PTXAS, REASONS
from safejit.spec import BuildSpec, LoadBaseline, Toolchain

__all__ = [
    "FIELD_STRATEGIES",
    "TOOLCHAIN_FIELD_STRATEGIES",
    "anchored_paths",
    "build_specs",
    "define_maps",
    "dep_tuples",
    "different_value",
    "family_flags",
    "flag_families",
    "flag_lists",
    "flag_texts",
    "hex64",
    "idents",
    "toolchains",
]

#: 64 lowercase hex digits, as produced by the package's own digest.
hex64 = st.binary(min_size=0, max_size=24).map(digest_bytes)

#: Kernel / define / extra names: ``[A-Za-z_][A-Za-z0-9_]{0,20}``.
idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)

tenants = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,15}", fullmatch=True)

_short_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)

_tool_dirs = st.lists(
    st.sampled_from(
        ["/usr", "/usr/include", "/usr/lib/gcc/x86_64-linux-gnu/12/include", "/usr/local/include", "/opt/cuda"]
    ),
    unique=True,
    max_size=3,
).map(tuple)

#: One strategy per Toolchain field.
TOOLCHAIN_FIELD_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "compiler": st.sampled_from(["/usr/bin/cc", "/usr/bin/gcc", "/usr/bin/clang", "/usr/local/cuda/bin/nvcc"]),
    "version": st.from_regex(r"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}", fullmatch=True),
    "digest": hex64,
    "roots": _tool_dirs,
    "search_dirs": _tool_dirs,
    "asm_deps": st.booleans(),
    "link_deps": st.booleans(),
    "link_inputs": _tool_dirs,
    "link_roots": _tool_dirs,
    "prefix": st.sampled_from(["", "/usr", "/opt/cuda"]),
    "spelled_dirs": _tool_dirs,
    "load_baseline": st.none()
    | st.builds(
        LoadBaseline,
        elf_class=st.sampled_from([1, 2]),
        byte_order=st.sampled_from([1, 2]),
        machine=st.sampled_from([3, 62, 183]),
        init=st.integers(-1, 64),
        fini=st.integers(-1, 64),
        init_array=st.integers(0, 3),
        fini_array=st.integers(0, 3),
        ctors=st.integers(0, 32),
        dtors=st.integers(0, 32),
        startup_refs=st.lists(st.sampled_from(["__gmon_start__", "__cxa_finalize", "_ITM_x"]), unique=True).map(tuple),
    ),
}

toolchains = st.fixed_dictionaries(TOOLCHAIN_FIELD_STRATEGIES).map(lambda kw: Toolchain(**kw))

#: ``(anchor, relpath)`` pairs: source roots ``s0``… and toolchain roots ``t0``…
anchored_paths = st.tuples(
    st.sampled_from(["s0", "s1", "s2", "t0"]),
    st.sampled_from([".", "include", "include/detail", "third_party/inc", "src"]),
)


def _sorted_pairs(keys: st.SearchStrategy[str], values: st.SearchStrategy[Any], max_size: int) -> st.SearchStrategy:
    return st.dictionaries(keys, values, max_size=max_size).map(lambda d: tuple(sorted(d.items())))


_defines = _sorted_pairs(idents, st.none() | _short_text, 5)
_flags = st.lists(
    st.sampled_from(
        [
            "-O3",
            "-Wall",
            "-Wextra",
            "-g",
            "-ffast-math",
            "-fno-strict-aliasing",
            "-std=c11",
            "-std=c++17",
            "-march=x86-64",
        ]
    ),
    unique=True,
    max_size=5,
).map(tuple)
_extra_values = st.one_of(st.integers(-(10**6), 10**6), st.booleans(), _short_text).map(json.dumps)
_extras = _sorted_pairs(idents, _extra_values, 4)
_env = _sorted_pairs(st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True), _short_text, 3)
_code = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=200).map(str.encode)
_argv_words = st.sampled_from(["-shared", "-fPIC", "-O2", "-MD", "-MF", "{DEP}", "-o", "{OUT}", "-x", "c", "{SRC}"])

#: One strategy per BuildSpec field, each drawing any valid value for it.
FIELD_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "schema": st.integers(1, 4),
    "backend": st.sampled_from(["host/1", "host/2", "cuda/1"]),
    "tenant": tenants,
    "toolchain": toolchains,
    "name": idents,
    "language": st.sampled_from(["c", "c++", "cuda"]),
    "filename": st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}\.(c|cpp|cu)", fullmatch=True),
    "source_digest": hex64,
    "code": _code,
    "include_dirs": st.lists(anchored_paths, max_size=4).map(tuple),
    "quote_dir": st.none() | anchored_paths,
    "defines": _defines,
    "flags": _flags,
    "extras": _extras,
    "env": _env,
    "arch": st.sampled_from([None, "sm_90"]),
    "argv": st.lists(st.one_of(_argv_words, _short_text), max_size=12).map(tuple),
    "name_expressions": st.lists(idents, max_size=3).map(tuple),
}

#: Two distinct valid values per field: the fallback when a draw happens to
#: equal the current value (so ``different_value`` never has to filter).
_FALLBACKS: dict[str, tuple[Any, Any]] = {
    "schema": (1, 2),
    "backend": ("host/1", "cuda/1"),
    "tenant": ("default", "acme"),
    "toolchain": (
        Toolchain(compiler="/usr/bin/cc", version="12.2.0", digest=digest_bytes(b"cc"), roots=("/usr",)),
        Toolchain(compiler="/usr/bin/clang", version="16.0.6", digest=digest_bytes(b"clang"), roots=("/usr",)),
    ),
    "name": ("kernel", "add"),
    "language": ("c", "c++"),
    "filename": ("kernel.c", "kernel.cpp"),
    "source_digest": (digest_bytes(b"a"), digest_bytes(b"b")),
    "code": (b"int f(void){return 0;}\n", b"int f(void){return 1;}\n"),
    "include_dirs": ((), (("s0", "include"),)),
    "quote_dir": (None, ("s0", ".")),
    "defines": ((), (("NDEBUG", None),)),
    "flags": ((), ("-Wall",)),
    "extras": ((), (("tile", "16"),)),
    "env": ((), (("LANG", "C"),)),
    "arch": (None, "sm_90"),
    "argv": ((), ("cc", "{SRC}")),
    "name_expressions": ((), ("add",)),
}

_TOOLCHAIN_FALLBACKS: dict[str, tuple[Any, Any]] = {
    "compiler": ("/usr/bin/cc", "/usr/bin/clang"),
    "version": ("12.2.0", "16.0.6"),
    "digest": (digest_bytes(b"a"), digest_bytes(b"b")),
    "roots": ((), ("/usr",)),
    "search_dirs": ((), ("/usr/include",)),
    "asm_deps": (False, True),
    "link_deps": (False, True),
    "link_inputs": ((), ("/usr/lib/x86_64-linux-gnu/crti.o",)),
    "link_roots": ((), ("/usr/lib/x86_64-linux-gnu",)),
    "load_baseline": (None, LoadBaseline(2, 1, 62, 23, 9, 1, 1, 0, 0, ("__gmon_start__",))),
}

_TABLES: dict[type, tuple[dict[str, st.SearchStrategy[Any]], dict[str, tuple[Any, Any]]]] = {
    BuildSpec: (FIELD_STRATEGIES, _FALLBACKS),
    Toolchain: (TOOLCHAIN_FIELD_STRATEGIES, _TOOLCHAIN_FALLBACKS),
}


@st.composite
def build_specs(draw: st.DrawFn) -> BuildSpec:
    """A plausible, internally coherent BuildSpec."""
    name = draw(idents)
    language = draw(st.sampled_from(["c", "c++"]))
    toolchain = draw(toolchains)
    code = draw(_code)
    include_dirs = draw(FIELD_STRATEGIES["include_dirs"])
    quote_dir = draw(FIELD_STRATEGIES["quote_dir"])
    defines = draw(_defines)
    flags = draw(_flags)
    arch = draw(FIELD_STRATEGIES["arch"])
    argv = [toolchain.compiler, "-shared", "-fPIC", "-O2", *flags]
    argv += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines]
    argv += [f"-I{Anchors.token(*d)}" for d in include_dirs]
    if quote_dir is not None:
        argv += ["-iquote", Anchors.token(*quote_dir)]
    argv += ["-MD", "-MF", "{DEP}", "-o", "{OUT}", "-x", language, "{SRC}"]
    return BuildSpec(
        schema=KEY_SCHEMA,
        backend="host/1",
        tenant=draw(tenants),
        toolchain=toolchain,
        name=name,
        language=language,
        filename=f"{name}.cpp" if language == "c++" else f"{name}.c",
        source_digest=digest_bytes(code),
        code=code,
        include_dirs=include_dirs,
        quote_dir=quote_dir,
        defines=defines,
        flags=flags,
        extras=draw(_extras),
        env=draw(_env),
        arch=arch,
        argv=tuple(argv),
        name_expressions=draw(FIELD_STRATEGIES["name_expressions"]),
    )


@st.composite
def different_value(draw: st.DrawFn, obj: BuildSpec | Toolchain, field: str) -> Any:
    """A valid value for ``obj.field`` (a BuildSpec or a Toolchain) that differs from the current one."""
    strategies, fallbacks = _TABLES[type(obj)]
    if field not in {f.name for f in dataclasses.fields(obj)}:
        raise ValueError(f"{type(obj).__name__} has no field {field!r}")
    current = getattr(obj, field)
    value = draw(strategies[field])
    if value == current:
        first, second = fallbacks[field]
        value = first if first != current else second
    assert value != current
    return value


#: ``(anchor, relpath, digest)`` dependency triples.
dep_tuples = st.tuples(
    st.sampled_from(["s0", "s1", "t0", "t1"]),
    st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.h", fullmatch=True),
    hex64,
)


# -- compiler flags (the flag policy's tables, and text near them) ------------------

#: The flag families, by name.
flag_families = st.sampled_from(sorted(FAMILIES))

_table_words = sorted(
    {
        *(e for f in FAMILIES.values() for e in (*f.options.exact, *f.options.valued, *f.machine, *f.path_flags)),
        *(e for f in FAMILIES.values() for e in f.ptxas),
        *LINKER.exact,
        *LINKER.valued,
        *LINKER_NEXT,
        *PTXAS.exact,
        *PTXAS.valued,
        *REASONS,
        *("-D", "-U", "-l", "-Wl,", "-lm", "-lgomp", "-march=native"),
    }
)
#: Any text at all, lone surrogates, NUL and line breaks included.
_any_text = st.text(st.characters(exclude_categories=()), max_size=24) | st.sampled_from(
    ["", "\0", "\n", "\ud800", "$(x)", "`x`", ",", "=", "@x", "/etc/passwd", "-"]
)
#: One argv item: a table entry, an entry with text glued on (a value, a suffix), two
#: joined with a comma (-Wl, and ptxas lists), or any text; now and then no str at all.
flag_texts: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(_table_words),
    st.tuples(st.sampled_from(_table_words), _any_text).map("".join),
    st.tuples(st.sampled_from(_table_words), st.sampled_from(_table_words)).map(",".join),
    _any_text,
    st.sampled_from([None, 5, b"-O2"]),
)


_mostly_nothing = st.one_of(st.just(""), st.just(""), st.just(""), _any_text)


def _valued_entries(valued: list[tuple[str, str]]) -> st.SearchStrategy[str]:
    """A valued entry with a value its grammar admits (and, now and then, text after it)."""
    return st.sampled_from(valued).flatmap(
        lambda ng: st.tuples(st.just(ng[0]), st.from_regex(ng[1], fullmatch=True), _mostly_nothing).map("".join)
    )


flag_lists = st.lists(flag_texts, max_size=6)


@st.composite
def family_flags(draw: st.DrawFn) -> tuple[str, list[Any]]:
    """A family and argv items for it: any items, or mostly its own entries (so that what
    is admitted is exercised too: a list is refused as soon as one item is)."""
    name = draw(flag_families)
    fam = FAMILIES[name]
    own = sorted({*fam.options.exact, *fam.machine, *(f"-l{n}" for n in fam.libraries)})
    valued = sorted({(n, g.pattern) for n, g in fam.options.valued.items()})
    ptxas = [st.tuples(st.sampled_from(fam.ptxas), st.sampled_from(sorted(PTXAS.exact))).map("".join)]
    mine = st.one_of(st.sampled_from(own), _valued_entries(valued), *(ptxas if fam.ptxas else []))
    item = st.one_of(mine, mine, mine, flag_texts)
    return name, draw(flag_lists | st.lists(item, max_size=4))


#: ``defines=`` as a tenant may pass them: any names, any values.
define_maps = st.dictionaries(idents | _any_text, st.none() | st.booleans() | st.integers() | _any_text, max_size=4)
