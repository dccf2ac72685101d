"""What a host build says its kernels take: the flags that make the compiler describe
them (DWARF), and the products of an artifact — its exported functions and their
prototypes — read from its bytes alone.

The debug info stays in the artifact: the bytes the compiler closed are the bytes
published (the leaf is staged as the compiler closes its artifact), so nothing
rewrites them. Its cost is kept small: no variable locations or views, no recorded
command line, structs described in full only when the kernel's own file defines
them (a pointer to one of a header's structs is then unsized), and the scratch
directory mapped away (the same inputs make the same bytes in any work dir)::

    argv = [..., *flags, *signature_flags(toolchain), "-fno-lto", ...]
    kernels, meta = host_products(so_bytes)
    meta["signatures"]["add"]   # ((ret code, spelling), ((name, code, spelling), ...), varargs)
"""

from __future__ import annotations

import logging
from typing import Any, Final

from .. import _forksafe
from ..errors import LoadError
from ..spec import Toolchain
from ._argv import DEBUG_MAP
from ._dwarf import DwarfError
from ._elf import Elf, ElfError, dynsym_functions
from ._prototypes import Prototype, prototypes
from .base import Products

__all__ = ["host_products", "signature_flags"]

logger = logging.getLogger(__name__)

#: GCC: DWARF without what no prototype needs (measured on an STL-heavy C++ kernel:
#: compile time +26% with plain -g, +5% with these; artifact 22 KB -> 252 KB / 120 KB).
_GCC: Final = (
    "-g",
    "-gno-record-gcc-switches",
    "-fno-var-tracking",
    "-gno-statement-frontiers",
    "-gno-variable-location-views",
    "-fno-debug-types-section",
    "-femit-struct-debug-baseonly",
    DEBUG_MAP,
)
_CLANG: Final = ("-g", "-gno-record-gcc-switches", "-fno-debug-types-section", DEBUG_MAP)

#: What the manifest's schema bounds (``cache.leaf.HostSignature``): a kernel past them
#: goes without a signature (its calls then need argtypes=) rather than fail its build.
_MAX_PARAMS: Final = 4096
_MAX_TEXT: Final = 1024
_MAX_REASON: Final = 200
_memo_lock = _forksafe.Lock()
_memo: tuple[bytes, Products] | None = None


def _kept(p: Prototype) -> tuple[Any, ...]:
    """A prototype as the manifest's schema takes it: text clipped, one line each (what
    the debug info names is the kernel author's to choose)."""

    def text(value: str, limit: int = _MAX_TEXT) -> str:
        flat = "".join(c if c.isprintable() else "?" for c in value)
        return flat if len(flat) <= limit else flat[: limit - 3] + "..."

    def code(value: str) -> str:
        return text(value, _MAX_REASON) if value.startswith("!") else value

    ret = (code(p.ret[0]), text(p.ret[1]))
    return ret, tuple((text(n), code(c), text(t)) for n, c, t in p.params), p.varargs


def is_clang(version: str) -> bool:
    """Whether a compiler that says ``version`` of itself is clang (else gcc)."""
    return "clang" in version.lower()


def signature_flags(toolchain: Toolchain) -> tuple[str, ...]:
    """The flags that have ``toolchain`` describe each function's prototype (after the
    user's flags: a ``-g0`` there does not turn them off)."""
    return _CLANG if is_clang(toolchain.version) else _GCC


def no_caret_flags(version: str) -> tuple[str, ...]:
    """The flags that keep a compiler from quoting a source line under a diagnostic
    (after the user's flags): a ``#line`` directive can name any file, which gcc then
    reopens to quote — a line of a file outside the roots in the log. gcc 11 on also
    opens it to count a column in characters: counted in bytes, it is not opened (a
    lookup outside the roots refuses the build)."""
    if is_clang(version):
        return ("-fno-caret-diagnostics",)
    major = gcc_major(version)
    if major is not None and major >= 11:
        return ("-fno-diagnostics-show-caret", "-fdiagnostics-column-unit=byte")
    return ("-fno-diagnostics-show-caret",)


def gcc_major(version: str) -> int | None:
    """The major version in the first line of ``gcc --version``: its last ``N.N`` or
    ``N.N.N`` word (``gcc (Debian 12.2.0-14) 12.2.0``: 12; a date after it is no
    version). Read without a regular expression: compiling one cost 0.1-0.2 ms of a
    fresh process's first compile, a disk hit."""
    words = version.partition("\n")[0].replace("(", " ").replace(")", " ").split()
    for word in reversed(words):
        parts = word.partition("-")[0].split(".")
        if 2 <= len(parts) <= 3 and all(p.isascii() and p.isdigit() for p in parts):
            return int(parts[0])
    return None


def host_products(artifact: bytes) -> Products:
    """The exported functions of a host artifact and ``{"signatures": {name:
    (ret, params, varargs)}}`` for those its debug info describes; the same for the same
    bytes (a compile reads them when its compiler closes the artifact and again when it
    exits: the second read is a comparison)."""
    global _memo
    memo = _memo
    if memo is not None and memo[0] == artifact:
        return memo[1]
    try:
        elf = Elf(artifact)
        kernels = dynsym_functions(artifact)
    except ElfError as exc:
        raise LoadError(f"artifact is not a readable ELF shared object: {exc}") from exc
    try:
        found = prototypes(elf, kernels)
    except DwarfError as exc:
        logger.debug("the artifact's debug info cannot be read (%s): its kernels have no signatures", exc)
        found = {}
    meta: dict[str, Any] = {}
    signatures = {name: _kept(p) for name, p in sorted(found.items()) if len(p.params) <= _MAX_PARAMS}
    if signatures:
        meta["signatures"] = signatures
    products: Products = (kernels, meta)
    with _memo_lock:
        _memo = (artifact, products)
    return products
