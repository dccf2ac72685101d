"""Key completeness: every file a build read lies under a declared root.

:func:`record_closure` confines, anchors and hashes what the compiler (and the
assembler, the linker) reported reading, and derives the negative lookups; the
facts themselves (digests, include names, negatives) come from ``closure``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from ..closure.anchors import LINK_ANCHOR, Anchors, is_under, real_path
from ..closure.scan import COARSE_NS, Closure, Dep, DepState, has_include_names, negative_lookups, scan_file
from ..errors import LimitExceededError, UndeclaredDependencyError

__all__ = ["changed_since", "record_closure"]

#: Paths that mean something else in the compiler than in this process.
_PER_PROCESS = ("/proc/", "/dev/")


def changed_since(ctime_ns: int, started_ns: int) -> bool:
    """Whether a file whose ctime is ``ctime_ns`` may have changed after ``started_ns``
    (within a coarse clock tick of it, or later: see ``scan.COARSE_NS``).

    The ctime alone says when a file last changed: the kernel sets it on every write,
    rename, ``utime`` or ``chmod``, and no user can set it. The mtime is whatever the
    last writer or ``utime`` made it (an archive unpacked with its recorded times, a
    clock running ahead): one in the future would make every build "too new" and
    nothing would ever be cached; one in the past says nothing either. A real change
    leaves ``ctime >= mtime``, so the ctime misses none that the mtime would catch.

    A ctime ahead of this host's clock (a file server whose clock runs ahead) cannot
    be ordered against the start: it counts as changed, and the build is not vouched
    for until the clocks agree. One behind it (the server's clock lags this host's
    by more than a tick) can hide a change made during the compile: shared source
    trees need synchronised clocks, as ``make`` and ccache do.
    """
    return ctime_ns > started_ns - COARSE_NS


def record_closure(
    paths: Sequence[str],
    anchors: Anchors,
    *,
    max_deps: int,
    started_ns: int,
    search_dirs: Sequence[str] = (),
    source: bytes = b"",
    trust_stat: bool = True,
    includes: bool = True,
    linker: bool = False,
) -> Closure:
    """Confine, anchor and hash the closure the compiler reported, and derive
    its negative lookups. Raises :class:`UndeclaredDependencyError` for a file
    outside every root and :class:`LimitExceededError` for too many files.
    Not ``includes``: files other tools read (objects, libraries), whose bytes
    hold no ``#include`` to follow; one that is gone or no regular file (after it is
    confined) makes the build one that is not vouched for (``too_new``). ``linker``: what the linker read, which
    may also lie under the linker's roots (and is anchored there first)."""
    if len(paths) > max_deps:
        raise LimitExceededError(f"{len(paths)} dependencies exceed the limit of {max_deps}", limit=max_deps)
    # (what the linker reads may lie where it finds libraries; what the source steers not)
    roots = [r for name, r in anchors.roots.items() if linker or not name.startswith(LINK_ANCHOR)]
    deps: list[Dep] = []
    states: list[DepState] = []
    too_new: list[str] = []
    probes = has_include_names(source)
    dirs: dict[str, str] = {}
    lexicals: list[str] = []
    quoted: list[str] = []
    for path in paths:
        if ("/" + os.path.normpath(path).lstrip("/")).startswith(_PER_PROCESS):  # ("//proc" too)
            # /proc/self/cwd/... named the compiler's own view, which the scan cannot share.
            raise UndeclaredDependencyError(
                f"the compiler read {path!r}, a per-process path; include files by their own path",
                path=path,
                resolved=path,
            )
        head, tail = os.path.split(path)
        real_dir = dirs.get(head)
        if real_dir is None:
            real_dir = dirs[head] = real_path(head)
        real = os.path.join(real_dir, tail)
        if os.path.islink(real):
            real = os.path.realpath(real)
        if not any(is_under(real, r) for r in roots):
            raise UndeclaredDependencyError(
                f"the compiler read {path!r} ({real}), outside every declared root; declare it in Config.source_roots",
                path=path,
                resolved=real,
            )
        # A ".." after a symlinked directory does not mean what normpath thinks:
        # such a path is recorded by its resolved form, the file actually read.
        dotdot = "/../" in path or path.endswith("/..")
        anchored = (None if dotdot else anchors.anchor(path)) or anchors.anchor(real)
        if linker:  # anchored where a verification confines it as the linker's read again
            anchored = (
                (None if dotdot else anchors.anchor_in(path, LINK_ANCHOR))
                or anchors.anchor_in(real, LINK_ANCHOR)
                or anchored
            )
        if anchored is None:  # pragma: no cover - real is under a root, so it anchors
            raise UndeclaredDependencyError(f"{path!r} cannot be anchored", path=path)
        lexical = anchors.expand(*anchored) or real
        try:
            snap, digest, file_probes, file_quoted = scan_file(lexical, trust_stat)
        except OSError:
            if includes:
                raise
            # Gone, or no regular file now (a .file directive's name, or a file the tool
            # read and someone swapped since): what it held is unknown. Built, not vouched for.
            too_new.append(lexical)
            continue
        if includes:
            probes += file_probes
            for name in file_quoted:  # "x.h" is looked for next to its includer first
                if not os.path.isabs(name) and ".." not in name.split("/"):
                    quoted.append(os.path.join(os.path.dirname(lexical), name))
        if changed_since(snap[4], started_ns):
            too_new.append(lexical)
        deps.append(Dep(anchored[0], anchored[1], digest))
        states.append((lexical, snap, digest))
        lexicals.append(lexical)
    read = set(lexicals)
    absent, present = negative_lookups(lexicals, search_dirs, probes)
    for q in quoted:
        if q not in read:
            (present if os.path.lexists(q) else absent).append(q)
    # A header where the compiler would have looked first, there now yet not read, may
    # have appeared during the compile: then what the compiler saw is unknown.
    for cand in present:
        with contextlib.suppress(OSError):
            st = os.lstat(cand)
            if changed_since(st.st_ctime_ns, started_ns):
                too_new.append(cand)
    negative_paths = []
    negatives = []
    for cand in sorted(set(absent)):
        anchored_cand = anchors.anchor(cand)
        if anchored_cand is not None:
            negatives.append(anchored_cand)
            negative_paths.append(cand)
    return Closure(deps, states, too_new, negatives, negative_paths)
