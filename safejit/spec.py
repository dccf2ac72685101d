"""Source, Toolchain and BuildSpec: frozen values that do no I/O when built.

A :class:`BuildSpec` is everything that decides the compiler's output except
the files the compiler reads through ``#include`` (those are the dependency
closure, keyed separately). Paths inside a spec are *anchored*: stored as
``(anchor, relpath)`` so that a checkout at another path keys the same.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .closure.anchors import encodable
from .closure.hashing import open_regular
from .errors import ConfigError, LimitExceededError

__all__ = ["NOT_IN_KEY", "TOOLCHAIN_NOT_IN_KEY", "AnchoredPath", "BuildSpec", "LoadBaseline", "Source", "Toolchain"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}\Z")
_CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")

AnchoredPath = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Source:
    """Kernel source text with a name.

    ``name`` is ``[A-Za-z_][A-Za-z0-9_]{0,127}``. ``filename`` picks the
    language (``.cpp``/``.cc``/``.cxx`` is C++, else C for the host backend;
    ``.cu`` CUDA) and the name the compiler sees; ``origin`` is the file the
    code was read from, whose directory serves quoted includes.
    """

    code: str
    name: str
    filename: str | None = None
    origin: str | None = None
    #: What it is compared by, as one tuple: the memory tier's keys hold it rather than
    #: the Source (a tuple hashes in C; a class's ``__hash__`` is a Python call).
    _key: tuple[str, str, str | None, str | None] = field(
        init=False, repr=False, compare=False, default=("", "", None, None)
    )
    #: Computed once.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Source], tuple[str, str, str | None, str | None]]:
        return (Source, (self.code, self.name, self.filename, self.origin))  # the hash is per process

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise ConfigError(f"Source.code must be str, got {type(self.code).__name__}")
        if "\0" in self.code:
            raise ConfigError("Source.code contains a NUL byte")
        for what in ("code", "filename", "origin"):
            value = getattr(self, what)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"Source.{what} must be str or None, got {type(value).__name__}")
            if isinstance(value, str) and not encodable(value):
                raise ConfigError(f"Source.{what} is not valid text (it holds a lone surrogate)")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"Source.name {self.name!r} must match [A-Za-z_][A-Za-z0-9_]{{0,127}}")
        if self.filename is not None and not _FILENAME.match(Path(self.filename).name):
            raise ConfigError(f"Source.filename {self.filename!r} has unsafe characters")
        key = (self.code, self.name, self.filename, self.origin)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None, max_bytes: int = 4 << 20) -> Source:
        """Read a source file. Confinement of ``path`` happens at compile time
        (``Runtime.source`` confines it first)."""
        fd, _ = open_regular(os.fspath(path))  # (never blocks on a FIFO)
        try:
            return cls.from_fd(fd, path, name=name, max_bytes=max_bytes)
        finally:
            os.close(fd)

    @classmethod
    def from_fd(cls, fd: int, path: str | Path, *, name: str | None = None, max_bytes: int = 4 << 20) -> Source:
        """Read a source from an open file ``fd`` (read from where it is); ``path`` names
        it (its name, language and the directory of its quoted includes)."""
        p = Path(path)
        chunks = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise LimitExceededError(f"source {p} is over {max_bytes} bytes", path=str(p), limit=max_bytes)
        try:
            code = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"source {p} is not UTF-8: {exc}", path=str(p)) from exc
        stem = re.sub(r"[^A-Za-z0-9_]", "_", p.stem) or "kernel"
        if stem[0].isdigit():
            stem = "_" + stem
        return cls(code=code, name=name or stem[:128], filename=p.name, origin=str(p))

    def staged_filename(self, default_suffix: str) -> str:
        """The file name the source is given in the staging directory."""
        return Path(self.filename).name if self.filename else f"{self.name}{default_suffix}"

    def is_cxx(self) -> bool:
        return bool(self.filename) and Path(self.filename or "").suffix in _CXX_SUFFIXES


@dataclass(frozen=True, slots=True)
class LoadBaseline:
    """What the toolchain's own empty shared object runs or calls when it is loaded and
    unloaded (its crt files: ``_init``, ``frame_dummy``, ``__do_global_dtors_aux``): a
    host kernel may hold exactly this and nothing more (``backends/_load_time.py``)."""

    #: ``EI_CLASS``, ``EI_DATA`` and ``e_machine`` of what the toolchain links.
    elf_class: int
    byte_order: int
    machine: int
    #: Size of ``.init`` / ``.fini`` where ``DT_INIT`` / ``DT_FINI`` is set; -1: not set.
    init: int
    fini: int
    #: Entries of ``DT_INIT_ARRAY`` / ``DT_FINI_ARRAY``.
    init_array: int
    fini_array: int
    #: Bytes of ``.ctors`` / ``.dtors`` (older toolchains).
    ctors: int
    dtors: int
    #: Symbols the start-up code calls if something defines them (``__gmon_start__``,
    #: ``__cxa_finalize``, ``_ITM_registerTMCloneTable``…): the link's undefined
    #: dynamic symbols, which must stay undefined in every kernel.
    startup_refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Toolchain:
    """A probed compiler: identity, version, binary digest and its roots."""

    compiler: str
    version: str
    digest: str
    #: Directories of the toolchain itself (install dir, system include dirs).
    roots: tuple[str, ...]
    #: The compiler's own include search list, in order.
    search_dirs: tuple[str, ...] = ()
    #: The assembler reports the files it reads (``.incbin``, ``.include`` in inline
    #: asm), which the compiler's depfile never names (host: GNU as ``--MD``).
    asm_deps: bool = False
    #: The linker reports the files it reads (crt files, libraries, linker scripts):
    #: host, GNU ld and lld ``--dependency-file``.
    link_deps: bool = False
    #: What the linker reads linking nothing, as it names them (crt files, libc, libgcc):
    #: the toolchain's own, in its digest; only what flags add joins a closure.
    link_inputs: tuple[str, ...] = ()
    #: Where the linker finds libraries: declared roots for what the linker reads only
    #: (anchors ``l0``…), never for includes, sources or paths in flags.
    link_roots: tuple[str, ...] = ()
    #: What the toolchain's own empty shared object runs at load (host): anything a
    #: kernel runs beyond it is refused. None: no baseline (other backends).
    load_baseline: LoadBaseline | None = None
    #: Where the toolchain is installed. Paths under it enter keys relative to it, so the
    #: same toolchain (the same binaries: ``digest``) installed elsewhere on another node
    #: shares entries (DESIGN.md §4). "" : the compiler's ``<prefix>/bin/..`` parent.
    prefix: str = ""
    #: The include dirs the compiler's ``-v`` names, searched or skipped as not there, as
    #: it spells them (``..`` and all): what it looks up at every compile, and the dirs on
    #: the way to those it skips, are its own lookups (``completeness.first_lookup_outside``).
    spelled_dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """Everything known before compiling. ``keys.build_key`` hashes every field
    not named in :data:`NOT_IN_KEY`, in declaration order."""

    schema: int
    backend: str
    tenant: str
    toolchain: Toolchain
    name: str
    language: str
    filename: str
    source_digest: str
    code: bytes
    include_dirs: tuple[AnchoredPath, ...]
    quote_dir: AnchoredPath | None
    defines: tuple[tuple[str, str | None], ...]
    flags: tuple[str, ...]
    extras: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    arch: str | None
    #: Final argv with anchored paths and ``{SRC}``/``{OUT}``/``{DEP}`` slots.
    argv: tuple[str, ...]
    #: Kernel names asked for by the caller (C++ name expressions on CUDA).
    name_expressions: tuple[str, ...] = ()


#: Toolchain fields that do not enter ``build_key`` as themselves, each with the reason.
TOOLCHAIN_NOT_IN_KEY: Final[dict[str, str]] = {
    "prefix": "paths under it enter the key relative to it; its binaries' digests say which toolchain it is",
    "spelled_dirs": "those searched enter the key as search_dirs; those skipped: a probe stands only while each "
    "is still not there (one made since is a new probe)",
}

#: BuildSpec fields that do not enter ``build_key``, each with the reason.
NOT_IN_KEY: Final[dict[str, str]] = {
    "code": "represented by source_digest (the hash of these exact bytes)",
}
