"""NVRTC compiled once with the real search path, its lookups recorded.

The worker runs NVRTC with ``-I`` for every search dir (quote dir, include dirs,
the toolchain's), may read only under the declared roots (Landlock), and records
every path NVRTC looks up, found or not (``safejit.sandbox.lookups``). What it
found is the closure; what it looked for and did not find are the negative
dependencies: a header made later where NVRTC looked first (shadowing), or a
``__has_include`` that would now be true, makes the leaf stale. Computed
includes, ``#include_next`` and ``__has_include`` need nothing of their own:
NVRTC resolves them, and every lookup that takes is recorded.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ...closure.anchors import LOOKED_OUTSIDE, Walk, first_outside
from ...errors import CompileError, LimitExceededError, UndeclaredDependencyError
from ...policy.completeness import LIMIT_SAID, lookups_limit
from .nvrtc import PROGRAM_DIR, LookupRow, NvrtcRequest, NvrtcResult

__all__ = ["Reads", "compile_recorded", "recorded_options", "sort_lookups"]

logger = logging.getLogger(__name__)

#: Path flags that only add search dirs: passed to NVRTC through ``search_dirs``, in order.
_SEARCH_FLAGS: Final = ("-I", "-isystem", "-iquote", "-idirafter")
_REFUSED: Final = (errno.EACCES, errno.EPERM)
_FOUND_BY_NAME: Final = ("stat", "lstat", "access", "readlink", "statfs")


@dataclass(frozen=True, slots=True)
class Reads:
    #: Files NVRTC read, or found without reading them, absolute, in the order first seen.
    deps: tuple[str, ...]
    #: Paths NVRTC looked up and did not find.
    absent: tuple[str, ...]
    #: Files NVRTC was refused (outside the roots, for Landlock).
    denied: tuple[str, ...]
    #: Lookups whose effect a closure of files cannot hold (a directory listed, a chdir).
    unknown: tuple[str, ...]


def sort_lookups(rows: Sequence[LookupRow], *, is_dir: Callable[[str], bool] = os.path.isdir) -> Reads:
    """The recorded ``(kind, errno, flags, path)`` rows sorted into :class:`Reads`.
    Lookups under NVRTC's made-up program dir are left out (nothing is there)."""
    read: dict[str, None] = {}
    found: dict[str, None] = {}
    absent: dict[str, None] = {}
    denied: dict[str, None] = {}
    unknown: dict[str, None] = {}
    private = PROGRAM_DIR + "/"
    for kind, error, flags, path in rows:
        if path.startswith(private) or path == PROGRAM_DIR:
            continue
        if kind == "open":
            if flags & os.O_ACCMODE != os.O_RDONLY:
                if not error:  # (writes: the worker has nowhere to write under Landlock)
                    unknown.setdefault(path)
            elif not error:
                (unknown if flags & os.O_DIRECTORY else found if flags & os.O_PATH else read).setdefault(path)
            elif error in _REFUSED:
                denied.setdefault(path)
            else:
                absent.setdefault(path)
        elif kind in _FOUND_BY_NAME:
            (absent if error else found).setdefault(path)
        elif not error:  # chdir: later relative lookups would mean something else
            unknown.setdefault(path)
    # Found without being read: a file (its existence, e.g. __has_include, made a difference),
    # or a search dir (NVRTC checks those): only files are part of a closure.
    deps = [*read, *(p for p in found if p not in read and not is_dir(p))]
    seen = set(deps)
    return Reads(
        tuple(deps),
        tuple(p for p in absent if p not in seen and p not in found),
        tuple(denied),
        tuple(unknown),
    )


def recorded_options(options: Sequence[str], search_dirs: Sequence[str], expand: Callable[[str], str]) -> list[str]:
    """NVRTC's options for a recorded compile: the spec's (anchored paths expanded),
    its search-dir flags replaced by ``-I`` for each of ``search_dirs``, in order."""
    kept = [expand(o) for o in options if not o.startswith(_SEARCH_FLAGS)]
    return [*kept, *(f"-I{d}" for d in search_dirs)]


def compile_recorded(
    code: bytes,
    name: str,
    options: list[str],
    name_expressions: list[str],
    *,
    compile_once: Callable[[NvrtcRequest, float], NvrtcResult],
    timeout: float,
    max_deps: int,
    confine: Callable[[str], str],
    roots: Sequence[str],
    max_cubin: int | None = None,
) -> tuple[NvrtcResult, Reads]:
    """One NVRTC compile, its lookups recorded (``options`` hold the search path).
    Raises :class:`~safejit.errors.UndeclaredDependencyError` when NVRTC was refused a file
    outside the roots (Landlock), or found one there (no Landlock here: ``confine``
    says, for what lies outside ``roots`` by name); and
    :class:`~safejit.errors.LimitExceededError` for a closure over ``max_deps``. (What
    lies under a root by name yet outside it through a symlink is the closure's to
    refuse.)"""
    result = compile_once(
        NvrtcRequest(code, name, options, name_expressions, record=True, max_cubin=max_cubin), timeout
    )
    if result.lookups is None:
        raise CompileError(f"{name}: the NVRTC worker recorded no lookups\n{result.log}", log=result.log)
    looked = len({row[3] for row in result.lookups})
    if looked > lookups_limit(max_deps):  # (each is walked and sorted below: counted first, as a preprocessor's)
        limit = lookups_limit(max_deps)
        raise LimitExceededError(
            f"{name}: NVRTC looked up {looked} distinct paths; the limit is {limit} ({LIMIT_SAID})", limit=limit
        )
    reads = sort_lookups(result.lookups)
    under = tuple(r.rstrip("/") + "/" for r in roots)
    walk = Walk(roots)
    # A lookup outside the roots fails the compile one way, whether a file is there (Landlock
    # refused it; no Landlock: found) or not: which of the two is no business of the source's.
    # (read outside them counts too: a file the worker may read for NVRTC's own sake)
    outside = (
        first_outside(reads.denied, roots)
        or first_outside(reads.absent, roots)
        or first_outside(reads.deps, roots)
        # (walked as the kernel walks it: a '..' out of a dir outside the roots, a link in a
        # root whose target passes through one — where it lands says whether that dir is there)
        or next((p for p in (*reads.denied, *reads.absent, *reads.deps) if walk.leads_out(p)), None)
    )
    for path in reads.denied:
        if outside is None:
            confine(path)  # (a file under a root by name, outside it through a symlink: refused)
            raise CompileError(f"{name}: NVRTC may not read {path} (permission denied)", log=result.log)
    for path in reads.deps:
        if outside is None and not os.path.normpath(path).startswith(under):
            confine(path)
    if outside is not None:
        logger.debug("%s: refused: NVRTC looked for %r, outside every root", name, outside)
        raise UndeclaredDependencyError(f"{name}: {LOOKED_OUTSIDE}")
    if len(reads.deps) > max_deps:
        raise LimitExceededError(
            f"{name}: {len(reads.deps)} dependencies exceed the limit of {max_deps}", limit=max_deps
        )
    return result, reads
