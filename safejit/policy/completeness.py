"""Key completeness: every file a build read lies under a declared root.

:func:`record_closure` confines, anchors and hashes what the compiler (and the
assembler, the linker) reported reading, and derives the negative lookups; the
facts themselves (digests, include names, negatives) come from ``closure``. Past the
style's ~450 lines: every way a compiler finds a file (next to its includer, by
search dir, by ``..``, through a link, by a probe) is derived here, beside the others
it must agree with.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from ..closure.anchors import (
    LINK_ANCHOR,
    LOOKED_OUTSIDE,
    Anchors,
    Walk,
    encodable,
    first_outside,
    is_under,
    real_path,
)
from ..closure.hashing import Snapshot, snapshot_of
from ..closure.scan import (
    COARSE_NS,
    PCH_SUFFIX,
    PROBE_WORDS,
    Closure,
    Dep,
    DepState,
    ProbeMacros,
    Scanned,
    has_include_probes,
    negative_lookups,
    probe_macros,
    scan_file,
)
from ..errors import LimitExceededError, UndeclaredDependencyError

__all__ = ["OWN_LOOKUPS", "OutsideCheck", "first_lookup_outside", "record_closure", "with_recorded_lookups"]

logger = logging.getLogger(__name__)

#: Paths that mean something else in the compiler than in this process.
_PER_PROCESS = ("/proc/", "/dev/")

#: The macros compilers define unasked whose names are not reserved (GNU modes: ``gcc
#: -dM -E`` on each target; nvcc's own ``-D``s, ``nvcc --dryrun``). A reserved name
#: (``__x``, ``_X``) may be predefined too.
PREDEFINED: Final = frozenset(
    {"linux", "unix", "i386", "sun", "sparc", "mips", "vax", "hppa", "m68k", "mc68000"}
    | {"CUDA_DOUBLE_MATH_FUNCTIONS", "CUDA_API_PER_THREAD_DEFAULT_STREAM"}
)
_IDENT: Final = re.compile(r"[A-Za-z_$][\w$]*")
#: The paths looked up and not found that a closure may hold (its negative lookups), and
#: the distinct paths its compiler may look up, per dependency it may hold (``max_deps``),
#: and at least :data:`LOOKUPS_FLOOR`: each is walked, anchored, kept in the manifest and
#: checked at each hit. Thousands of ``__has_include`` probes, each in every include dir,
#: made hundreds of MB of manifest and minutes of this process's time past the compile's
#: limit. (A header is looked for in each include dir before its own: a CuTe GEMM, ~400
#: files in ~8 dirs, looks up ~3,000 paths, ~900 of them not there; the floor keeps a
#: ``max_deps`` tuned down to a project's size from refusing its many dirs.)
NEGATIVES_PER_DEP: Final = 4
LOOKUPS_FLOOR: Final = 100_000
#: How the limit is made, in a message.
LIMIT_SAID: Final = f"{NEGATIVES_PER_DEP} per dependency of max_deps, at least {LOOKUPS_FLOOR}"


def lookups_limit(max_deps: int) -> int:
    """The most negative lookups, and distinct paths a compile's preprocessors look up,
    that a closure of at most ``max_deps`` files may come with."""
    return max(NEGATIVES_PER_DEP * max_deps, LOOKUPS_FLOOR)


def _too_many(count: int, what: str, max_deps: int) -> LimitExceededError:
    limit = lookups_limit(max_deps)
    return LimitExceededError(f"{count} {what} exceed the limit of {limit} ({LIMIT_SAID})", limit=limit)


def _reserved(name: str) -> bool:
    return name.startswith("__") or (name[:1] == "_" and name[1:2].isupper())


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
    absent: Sequence[str] | None = None,
    spelled: Sequence[str] = (),
    ours: str | None = None,
) -> Closure:
    """Confine, anchor and hash the closure the compiler reported, and derive
    its negative lookups. Raises :class:`UndeclaredDependencyError` for a file
    outside every root (or one with other names that may lie outside: a hard link
    under a source root), for a ``__has_include`` probe outside every root, and
    :class:`LimitExceededError` for too many files. Each file is read through the
    descriptor whose real path was confined (a path swapped meanwhile reads nothing
    else). Not ``includes``: files other tools read (objects, libraries), whose bytes
    hold no ``#include`` to follow; one that is gone or no regular file (after it is
    confined) makes the build one that is not vouched for (``too_new``). ``linker``:
    what the linker read, which may also lie under the linker's roots (and is
    anchored there first). ``absent``: the paths the compiler looked up and did not
    find, when its lookups were recorded (NVRTC's worker): then they are the negative
    lookups, exactly, in place of those derived from ``search_dirs`` and the sources'
    include names and probes. A name that climbs (``..``) out of a dir outside every root
    (``anchors.Walk``: ``spelled``, ``ours``) is refused wherever it lands: it was read only
    because that dir is there (an assembler's ``.incbin "/x/../usr/include/stdio.h"``)."""
    if len(paths) > max_deps:
        raise LimitExceededError(f"{len(paths)} dependencies exceed the limit of {max_deps}", limit=max_deps)
    _refuse_names_that_are_not_text([*paths, *(absent or ())])
    # (what the linker reads may lie where it finds libraries; what the source steers not)
    roots = [r for name, r in anchors.roots.items() if linker or not name.startswith(LINK_ANCHOR)]

    def allowed(real: str) -> bool:
        return any(is_under(real, r) for r in roots)

    walk = Walk(roots, spelled=spelled)  # (one for every path: what it resolves, it keeps)
    for path in paths:
        if "/.." in path and walk.leads_out(path, ours=ours):
            logger.debug("refused: %r climbs out of a dir outside every root", path)
            raise UndeclaredDependencyError(LOOKED_OUTSIDE)
    # (where the compiler's lookups are recorded, its probes are among them: nothing to derive)
    reads = _Reads(anchors, allowed, started_ns, trust_stat, derived=absent is None)
    reads.probes = [(kind, name, "") for kind, name in has_include_probes(source)]
    if reads.derived:
        reads.add_macros(probe_macros(source), "")
    dirs: dict[str, str] = {}
    unsure = reads.unsure
    for path in paths:
        real = _confined(path, dirs, allowed)
        crossed, after_link = _dotdot_links(path, anchors)
        if after_link:
            unsure.append(f"{path} is reached by a '..' after a symbolic link")
        reads.add(path, real, _anchored(path, real, anchors, linker=linker, after_link=crossed), includes=includes)
    if absent is not None:
        if len(absent) > lookups_limit(max_deps):
            raise _too_many(len(absent), "negative lookups", max_deps)
        # Recorded: each was looked up and not found (shadowing, __has_include, .gch and
        # all). One that is there now appeared since: the build shows what was not there.
        present: list[str] = []
        missing: list[str] = []
        for cand in absent:
            if anchors.anchor(cand) is None:
                # Looked for outside every root (an absolute or ``..`` name): whether a file
                # is there is no declared input of the build, and could not be recorded.
                raise UndeclaredDependencyError(
                    f"the compiler looked for {cand!r}, outside every declared root", path=cand
                )
            if _dotdot_links(cand, anchors)[1]:
                unsure.append(f"{cand} was looked for by a '..' after a symbolic link")
            (reads.too_new if os.path.lexists(cand) else missing).append(cand)
    else:
        reads.probes_through_macros()
        # (each probe is looked for in each dir: counted before a path is made of one)
        if len(reads.probes) * max(1, len(search_dirs)) > lookups_limit(max_deps):
            raise _too_many(len(reads.probes) * max(1, len(search_dirs)), "probes in include dirs", max_deps)
        present, missing = reads.derived_lookups(search_dirs)
        reads.add_precompiled(present)
        reads.add_probe_hits(search_dirs)
    # A header where the compiler would have looked first, there now yet not read, may
    # have appeared during the compile: then what the compiler saw is unknown. So may a
    # directory on the way to a file read have been swapped (a symlink put in and taken
    # out again): its entries changed during the compile.
    if len(missing) > lookups_limit(max_deps):
        raise _too_many(len(missing), "negative lookups", max_deps)
    reads.add_if_changed([*present, *_directories(reads.lexicals, anchors)])
    negatives, negative_paths = _anchored_negatives(missing, anchors)
    return Closure(reads.deps, reads.states, reads.too_new, negatives, negative_paths, tuple(unsure))


#: What a compiler looks up outside every root whatever it compiles (clang: the root dir,
#: its own open files): nothing a source steers, nothing a tenant learns.
OWN_LOOKUPS: Final = frozenset(
    {
        "/",
        "/proc/self/fd",
        "/dev/null",
        # (nvcc's cicc, at every compile: refused by the sandbox, or no regular file to
        # include; and, compilers running with TZ=UTC0, the zone file libc looks for first,
        # which is no file: not /etc/localtime, which is one, and readable)
        "/proc/self/exe",
        "/proc/sys/vm/overcommit_memory",
        "/dev/urandom",
        "/usr/share/zoneinfo/UTC0",
    }
)


def first_lookup_outside(
    looked: Sequence[tuple[str, bool | None]], anchors: Anchors, *, spelled: Sequence[str], workdir: str
) -> str | None:
    """The first of the preprocessors' recorded lookups (``sandbox.lookups.read_preloaded``)
    that leads outside every root, other than the compiler's own (:class:`OutsideCheck`)."""
    return OutsideCheck(anchors, spelled=spelled, workdir=workdir).first(looked)


class OutsideCheck:
    """Which recorded lookups lead outside every root. Whatever the source looked up
    outside the roots — found or not, read or only probed, by a name a macro made — is
    one: a file there is refused to the compiler (Landlock) or probed (a ``stat`` is not
    confined), one not there is not, so a build that went on would say which files exist
    outside the roots. So is one whose walk (``anchors.Walk``, as the kernel walks it:
    links followed by their text, each ``..`` where it is by then) looks a name up
    outside, wherever it lands. The compiler's own: ``OWN_LOOKUPS``, the include dirs
    its ``-v`` names as it spells them (``spelled``: ``..`` in them is its own) and the
    dirs on their way, and, for a name looked for next to the main source, the work
    dir's parent (``<workdir>/src/../../x``: a private dir only this library names
    entries in). One check walks each name once, however often it is asked (a compile's
    records as they grow)."""

    __slots__ = ("_inside", "_next_to_source", "_own", "_scratch", "_walk")

    def __init__(self, anchors: Anchors, *, spelled: Sequence[str], workdir: str) -> None:
        # (the linker's roots are none of a preprocessor's: /usr/lib holds links out, to /etc)
        self._walk = Walk(
            [r for name, r in anchors.roots.items() if not name.startswith(LINK_ANCHOR)],
            spelled=spelled,
            system=[r for name, r in anchors.roots.items() if name.startswith("t")],
        )
        self._scratch = os.path.dirname(workdir)
        self._next_to_source = os.path.join(workdir, "src", "")
        # (a dir it names, or one on its way, as it spells them: looked up at every compile)
        self._own = set(OWN_LOOKUPS).union(*(_spelled_prefixes(d) for d in spelled))
        self._inside: set[str] = set()  # (paths found not to lead out)

    def first(self, looked: Sequence[tuple[str, bool | None]]) -> str | None:
        """The first of ``looked`` (``sandbox.lookups.read_preloaded``) that leads outside."""
        own, walk, inside = self._own, self._walk, self._inside
        for path, _ in looked:
            if path in inside or path in own or path.rstrip("/") in own:
                continue
            if walk.leads_out(path, ours=self._scratch if path.startswith(self._next_to_source) else None):
                return path
            inside.add(path)
        return None


def _spelled_prefixes(spelled: str) -> list[str]:
    """``spelled`` and each dir on its way, as spelt (``/usr/lib/gcc/x/12/..``, ``/usr``)."""
    parts = spelled.rstrip("/").split("/")
    return ["/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)]


def with_recorded_lookups(
    closure: Closure,
    looked: Sequence[tuple[str, bool | None]],
    anchors: Anchors,
    *,
    started_ns: int,
    trust_stat: bool = True,
) -> Closure:
    """``closure`` and what the preprocessors were recorded looking up under the roots
    (``sandbox.lookups.read_preloaded``: ``(path, found)``, found None when it changed
    while they ran) that the closure derived from the depfile and the sources misses —
    a probe whose name token pasting made (``CAT(HAS, INC)(<x.h>)``), any other: a path
    not there is a negative; a regular file found and not read (a probe's hit, a
    ``#pragma GCC dependency``) a dependency by its bytes; a path there now that was not
    then (or the other way), or a directory changed since the start, too new to vouch
    for. Only lookups under the source roots are taken: the toolchain's own are derived
    as before (its search dirs, the directories on the way to a header: the same for
    every build); one outside every root is refused before (:func:`first_lookup_outside`,
    checked by the build job ahead of the closure). A directory on the way to a negative
    already recorded adds nothing (the deepest one there vouches for it). The same
    ``closure`` when nothing is added."""
    roots = [r for name, r in anchors.roots.items() if not name.startswith(LINK_ANCHOR)]

    def allowed(real: str) -> bool:
        return any(is_under(real, r) for r in roots)

    reads = _Reads(anchors, allowed, started_ns, trust_stat, derived=False)
    known: set[str] | None = None  # (made when a lookup under a source root needs them)
    on_the_way: set[str] = set()
    missing: list[str] = []
    dirs: list[str] = []
    for path, found in looked:
        anchored = anchors.anchor(path)
        if anchored is None or not anchored[0].startswith("s"):
            continue
        if known is None:
            known = {lexical for lexical, _, _ in closure.states}.union(closure.negative_paths)
            on_the_way = _ancestors(closure.negative_paths)
        if path in known or path in on_the_way:
            continue
        known.add(path)
        if not encodable(path):  # (no key or manifest can hold its name)
            reads.unsure.append(f"the compiler looked up {path!r}, whose name is not UTF-8 text")
            continue
        there = os.path.lexists(path)
        if found is None or found != there:
            reads.too_new.append(path)  # (made or removed around the compile)
        elif _dotdot_links(path, anchors)[1]:
            reads.unsure.append(f"{path} was looked for by a '..' after a symbolic link")
        elif not there:
            missing.append(path)
        elif os.path.isdir(path):
            dirs.append(path)
        else:
            real = os.path.realpath(path)
            anchored = anchors.anchor(path) if allowed(real) else None
            if anchored is not None:  # (else found through a link out of the roots: never read)
                reads.add(path, real, anchored, includes=False, probed=True)
    reads.add_if_changed(dirs)
    if not (missing or reads.deps or reads.too_new or reads.unsure):
        return closure
    negatives, negative_paths = _anchored_negatives(missing, anchors)
    return Closure(
        [*closure.deps, *reads.deps],
        [*closure.states, *reads.states],
        [*closure.too_new, *reads.too_new],
        [*closure.negatives, *negatives],
        [*closure.negative_paths, *negative_paths],
        (*closure.unsure, *reads.unsure),
    )


def _ancestors(paths: Sequence[str]) -> set[str]:
    """Every directory above each of ``paths`` (those of a closure's negatives: a few dozen)."""
    found = {os.path.dirname(p) for p in paths}
    while len(found) > 1:
        more = {os.path.dirname(p) for p in found} - found
        if not more:
            break
        found |= more
    return found


def _dotdot_links(path: str, anchors: Anchors) -> tuple[bool, bool]:
    """Whether a ``..`` in ``path`` comes after a symbolic link (it then leads out of the
    link's target, wherever the link points at the time); and whether such a link lies
    outside the toolchain's own dirs (CUDA's ``targets/<arch>/include`` is one: probed,
    and not the tenant's to re-point). A leaf records files, not where links point: a
    build that depends on a tenant's link that way is never published (one re-pointed
    later made a stale hit)."""
    if "/../" not in path and not path.endswith("/.."):
        return False, False
    parts = path.split("/")
    crossed = False
    try:
        for i, part in enumerate(parts):
            if part == ".." and i:
                head = "/".join(parts[:i]) or "/"
                if os.path.realpath(head) != os.path.normpath(head):
                    crossed = True
                    found = anchors.anchor(os.path.normpath(head))
                    if found is None or not found[0].startswith("t"):
                        return True, True
    except ValueError:  # (a NUL in a name: none the compiler looked up)
        return False, False
    return crossed, False


def _confined(path: str, dirs: dict[str, str], allowed: Callable[[str], bool]) -> str:
    """The real path of a file the compiler read, which must lie under a root
    (``dirs``: the real paths of directories seen so far, filled in)."""
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
    if not allowed(real):
        raise _outside(path, real)
    return real


def _anchored(path: str, real: str, anchors: Anchors, *, linker: bool, after_link: bool = True) -> tuple[str, str]:
    """``(anchor, relative path)`` of a confined file: by the name the compiler gave
    where it can be, the linker's roots first for what the linker read."""
    # A ".." after a symlinked directory does not mean what normpath thinks: such a path
    # is recorded by its resolved form, the file actually read (and never published:
    # _dotdot_links). One that crosses no link is its normpath, whose later links
    # a verification resolves again (by its real path, re-pointing one made a stale hit).
    named: str | None = path
    if "/../" in path or path.endswith("/.."):
        named = None if after_link else os.path.normpath(path)
    anchored = (anchors.anchor(named) if named else None) or anchors.anchor(real)
    if linker:  # anchored where a verification confines it as the linker's read again
        anchored = (
            (anchors.anchor_in(named, LINK_ANCHOR) if named else None)
            or anchors.anchor_in(real, LINK_ANCHOR)
            or anchored
        )
    if anchored is None:  # pragma: no cover - real is under a root, so it anchors
        raise UndeclaredDependencyError(f"{path!r} cannot be anchored", path=path)
    return anchored


class _Reads:
    """What the files read hold, gathered a file at a time: their deps and states, those
    too new to vouch for, and what their sources probe and include by quoted name."""

    def __init__(
        self, anchors: Anchors, allowed: Callable[[str], bool], started_ns: int, trust_stat: bool, *, derived: bool
    ) -> None:
        self.anchors = anchors
        self.derived = derived
        self.allowed = allowed
        self.started_ns = started_ns
        self.trust_stat = trust_stat
        self.deps: list[Dep] = []
        self.states: list[DepState] = []
        self.too_new: list[str] = []
        self.lexicals: list[str] = []
        self.probes: list[tuple[str, str, str]] = []
        self.quoted: list[str] = []
        #: Directories of files that include a name a macro makes (``#include NAME``).
        self.computed: dict[str, None] = {}
        #: Files read by a name with ``..`` in it, as the compiler named them.
        self.dotdots: list[str] = []
        #: Why the closure cannot be recorded true (``Closure.unsure``).
        self.unsure: list[str] = []
        #: What each file probes through macros, with its directory.
        self.macros: list[tuple[ProbeMacros, str]] = []

    def add(self, path: str, real: str, anchored: tuple[str, str], *, includes: bool, probed: bool = False) -> None:
        """Hash (and, with ``includes``, scan) one confined file the compiler read as ``path``
        (``probed``: one a ``__has_include`` may have found, whose bytes were not read)."""
        lexical = self.anchors.expand(*anchored) or real
        try:
            scanned = scan_file(lexical, self.allowed, self.trust_stat, macros=self.derived and includes)
        except OSError:
            if includes:
                raise
            # Gone, or no regular file now (a .file directive's name, or a file the tool
            # read and someone swapped since): what it held is unknown. Built, not vouched for.
            self.too_new.append(lexical)
            return
        if scanned is None:  # swapped for a way out after the check above
            raise _outside(path, "(outside)")
        if scanned.nlink > 1 and anchored[0].startswith("s") and not probed:  # (a probe reads no bytes)
            # The same bytes under another name, which may lie outside every root (a
            # hard link an unpacked archive made, say): not what the roots declare.
            raise UndeclaredDependencyError(
                f"the compiler read {path!r}, a file with {scanned.nlink} names (hard links) that may lie "
                "outside the declared roots; copy it instead of linking it",
                path=path,
            )
        if includes:
            here = os.path.dirname(lexical)
            self.probes += [(kind, name, here) for kind, name in scanned.probes]
            for name in scanned.quoted:  # "x.h" is looked for next to its includer first
                if not os.path.isabs(name):  # ("../x.h" too: where it leads, unless through a link)
                    looked = os.path.join(here, name)
                    if _dotdot_links(looked, self.anchors)[1]:
                        self.unsure.append(f"{looked} is looked for by a '..' after a symbolic link")
                    self.quoted.append(os.path.normpath(looked))
            if scanned.computed:
                self.computed[here] = None
            self.add_macros(scanned.macros, here)
        self._keep(lexical, anchored, scanned)
        self.lexicals.append(lexical)
        if "/../" in path:
            self.dotdots.append(path)  # (as the compiler named it: under which search dir it was found)

    def _keep(self, lexical: str, anchored: tuple[str, str], scanned: Scanned) -> None:
        if changed_since(scanned.snap, self.started_ns):
            self.too_new.append(lexical)
        self.deps.append(Dep(anchored[0], anchored[1], scanned.digest))
        self.states.append((lexical, scanned.snap, scanned.digest))

    def add_macros(self, macros: ProbeMacros | None, here: str) -> None:
        if macros is not None:
            self.macros.append((macros, here))

    def probes_through_macros(self) -> None:
        """The probes made through a macro that wraps ``__has_include`` (CCCL's
        ``_CCCL_HAS_INCLUDE(<nvtx3/nvtx3.hpp>)``), known now that every file read is: each
        call of such a macro (or of another name for one) with a literal name is a probe
        like a literal one; a quoted name in a macro's body is looked for next to
        whichever file expands it, so next to each file read. A probe whose name a macro
        makes, or made through a macro where the name is not seen, or a ``<...>`` name
        read as tokens (given to a wrapper, or in a macro's body) that holds the name of
        a macro (defined by a file read, a ``-D`` or the compiler), cannot be recorded:
        the build is returned, never published (a header made there later hit the old
        binary). Where the compiler's lookups are recorded (NVRTC's worker), none of this
        is needed. (Token pasting that makes a wrapper's name, ``CAT(HAS, INC)`` given a
        name elsewhere, is not seen: docs/security.md.)"""
        wrappers = set(PROBE_WORDS) | {w for macros, _ in self.macros for w in macros.wrappers}
        names_for: dict[str, list[str]] = {}
        for macros, _ in self.macros:
            for name, target in macros.aliases:
                names_for.setdefault(target, []).append(name)
        todo = list(wrappers)
        while todo:  # (another name for a wrapper is one; so is another name for that)
            for name in names_for.get(todo.pop(), ()):
                if name not in wrappers:
                    wrappers.add(name)
                    todo.append(name)
        everywhere = sorted({os.path.dirname(p) for p in self.lexicals})
        defined = set(PREDEFINED).union(*(macros.defined for macros, _ in self.macros))
        seen = set(self.probes)
        for macros, here in self.macros:
            self.unsure += [f"{probe!r}: a __has_include of a name a macro makes" for probe in macros.opaque]
            self.unsure += [f"{w} is used where what it probes is unknown" for w in sorted(wrappers & macros.names)]
            for w, kind, name, in_define in macros.calls:
                if w not in wrappers:
                    continue
                if kind == "<" and (in_define or w not in PROBE_WORDS):  # (read as tokens, each expanded)
                    named = [i for i in _IDENT.findall(name) if i in defined or _reserved(i)]
                    if named:
                        self.unsure.append(f"{w}(<{name}>) probes a name the macro {named[0]} may change")
                        continue
                anywhere = in_define and kind == '"'
                if w in PROBE_WORDS and not anywhere and (kind, name, here) in seen:
                    continue  # (a literal __has_include that has_include_probes found too)
                if name.startswith("/") or ".." in name.split("/") or "\0" in name:
                    self.unsure.append(f"{w}({name}) probes by a path")  # (a look-alike in a comment, maybe)
                    continue
                self.probes += [(kind, name, d) for d in (everywhere if anywhere else [here])]

    def add_if_changed(self, paths: Sequence[str]) -> None:
        """Count as too new each of ``paths`` (not read) that changed since the start."""
        for cand in paths:
            with contextlib.suppress(OSError):
                if changed_since(snapshot_of(os.lstat(cand)), self.started_ns):
                    self.too_new.append(cand)

    def derived_lookups(self, search_dirs: Sequence[str]) -> tuple[list[str], list[str]]:
        """``(present, missing)``: where the compiler looked for what the sources include
        and probe, without reading it, derived from ``search_dirs``."""
        read = set(self.lexicals)
        missing, present = negative_lookups(self.lexicals, search_dirs, [name for _, name, _ in self.probes])
        for q in self.quoted:
            for cand in (q, q + PCH_SUFFIX):
                if cand not in read:
                    (present if os.path.lexists(cand) else missing).append(cand)
        for cand in _probes_by_path(self.probes, search_dirs, self.anchors, self.allowed):
            if cand not in read:
                (present if os.path.lexists(cand) else missing).append(cand)
        for kind, name, here in self.probes:  # ("x.h" is probed next to its prober first)
            if kind == '"' and here and name and not name.startswith("/") and ".." not in name.split("/"):
                for cand in (os.path.join(here, name), os.path.join(here, name) + PCH_SUFFIX):
                    if cand not in read:
                        (present if os.path.lexists(cand) else missing).append(cand)
        for cand in _beside_computed(self.computed, self.lexicals, search_dirs):
            if cand not in read:
                (present if os.path.lexists(cand) else missing).append(cand)
        for cand in _shadowing_dotdots(self.dotdots, search_dirs):
            if cand not in read and self.allowed(os.path.realpath(cand)):
                (present if os.path.lexists(cand) else missing).append(cand)
        return present, missing

    def add_probe_hits(self, search_dirs: Sequence[str]) -> None:
        """A literal ``__has_include`` that found a header the compiler did not read: the
        header is part of the closure, by its bytes (removed, it turns the answer)."""
        read = set(self.lexicals)
        for kind, name, here in self.probes:
            if not name or name.startswith("/") or ".." in name.split("/") or "\0" in name:
                continue  # (by path: _probes_by_path's; found there, it is a present lookup)
            first = [here] if kind == '"' and here else []
            # Every regular file a probe may find, not the first alone: which one a probe
            # finds (``_next``, ``<>`` or ``""``, a directory passed over) is the
            # compiler's, and one more dependency costs at most a rebuild.
            for hit in (os.path.join(d, name) for d in (*first, *search_dirs)):
                if hit in read or not os.path.isfile(hit):
                    continue
                real = os.path.realpath(hit)
                anchored = self.anchors.anchor(hit) or self.anchors.anchor(real)
                if anchored is None or not self.allowed(real):
                    continue  # (outside the roots: refused by the lookup's own rules, or the toolchain's)
                self.add(hit, real, anchored, includes=False, probed=True)
                read.add(hit)

    def add_precompiled(self, present: Sequence[str]) -> None:
        """A precompiled header there may have been used in place of its header, and the
        depfile then names the header alone: it is part of the closure, by its bytes."""
        for cand in [c for c in present if c.endswith(PCH_SUFFIX)]:
            anchored = self.anchors.anchor(cand)
            scanned = _scan_pch(cand, self.allowed, self.trust_stat)
            if anchored is None or scanned is None:
                raise _outside(cand, "(outside)")
            self._keep(cand, anchored, scanned)


def _beside_computed(here: Iterable[str], lexicals: Sequence[str], search_dirs: Sequence[str]) -> list[str]:
    """Where a compiler may have looked for what ``#include NAME`` named, for files in the
    directories ``here``: the name is unknown, but if it was quoted, it was looked for
    next to its includer first, and found in a search directory after — so each file
    read from a search directory, by its name there, must not appear next to such an
    includer. Each such name's shallowest part not there now is the lookup (a name whose
    first directory is missing: that directory), and its ``.gch`` where the header's
    directory is there."""
    dirs = [d.rstrip("/") + "/" for d in search_dirs]
    names = {p[len(d) :] for p in lexicals for d in dirs if p.startswith(d)}
    names = {n for n in names if ".." not in n.split("/") and not n.startswith("/")}
    found: dict[str, None] = {}
    for base in here:
        for name in sorted(names):
            path = base
            parts = name.split("/")
            for i, part in enumerate(parts):
                path = f"{path}/{part}"
                if i == len(parts) - 1:
                    found[path] = found[path + PCH_SUFFIX] = None
                elif not os.path.isdir(path):
                    found[path] = None  # (nothing under it can appear while it stays absent)
                    break
    return list(found)


def _shadowing_dotdots(paths: Sequence[str], search_dirs: Sequence[str]) -> list[str]:
    """Where the compiler looked, in earlier search dirs, for what it found by a name with
    ``..`` (``dir_N/../x.h``): ``dir_i/../x.h`` for each ``i < N``, and its ``.gch``.
    (Through a link, such a name is no record: that build is not published.)"""
    out = []
    for path in paths:
        for n, d in enumerate(search_dirs):
            if path.startswith(d.rstrip("/") + "/"):
                rel = path[len(d.rstrip("/")) + 1 :]
                for earlier in search_dirs[:n]:
                    cand = os.path.normpath(os.path.join(earlier, rel))
                    out += [cand, cand + PCH_SUFFIX]
                break
    return out


def _anchored_negatives(missing: Sequence[str], anchors: Anchors) -> tuple[list[tuple[str, str]], list[str]]:
    """The anchored negative lookups, and their paths (those under no root are not recorded)."""
    negative_paths = []
    negatives = []
    for cand in sorted(set(missing)):
        anchored_cand = anchors.anchor(cand)
        if anchored_cand is not None:
            negatives.append(anchored_cand)
            negative_paths.append(cand)
    return negatives, negative_paths


def _scan_pch(path: str, allowed: Callable[[str], bool], trust_stat: bool) -> Scanned | None:
    if os.path.isdir(path):
        raise UndeclaredDependencyError(
            f"{path!r} is a directory of precompiled headers, which the key cannot follow; remove it",
            path=path,
        )
    return scan_file(path, allowed, trust_stat, macros=False)


def changed_since(snap: Snapshot, started_ns: int) -> bool:
    """Whether a file (or directory) whose stat is ``snap`` may have changed after
    ``started_ns``, or within the coarse clock's lag before it (a change then can carry
    a timestamp just before the start: see ``scan.COARSE_NS``).

    The ctime alone says when a file last changed: the kernel sets it on every write,
    rename, ``utime`` or ``chmod``, and no user can set it. The mtime is whatever the
    last writer or ``utime`` made it (an archive unpacked with its recorded times, a
    clock running ahead): one in the future would make every build "too new" and
    nothing would ever be cached; one in the past says nothing either. A real change
    leaves ``ctime >= mtime``, so the ctime misses none that the mtime would catch.

    A ctime ahead of this host's clock (a file server whose clock runs ahead) cannot
    be ordered against the start: it counts as changed, and the build is not vouched
    for until the clocks agree. One behind it (the server's clock lags this host's
    by more than that lag) can hide a change made during the compile: shared source
    trees need synchronised clocks, as ``make`` and ccache do.
    """
    return snap[4] > started_ns - COARSE_NS


def _refuse_names_that_are_not_text(paths: Sequence[str]) -> None:
    """A name that is not UTF-8 (decoded with surrogate escapes) cannot enter a key or a
    manifest: the build is refused, naming it, rather than failing deep in the encoder."""
    for path in paths:
        if not encodable(path):
            raise UndeclaredDependencyError(
                f"the compiler read {path!r}, whose name is not UTF-8 text: it cannot be recorded in a "
                "closure; rename it",
                path=path,
            )


def _outside(path: str, real: str) -> UndeclaredDependencyError:
    return UndeclaredDependencyError(
        f"the compiler read {path!r} ({real}), outside every declared root; declare it in Config.source_roots",
        path=path,
        resolved=real,
    )


def _probes_by_path(
    probes: Sequence[tuple[str, str, str]],
    search_dirs: Sequence[str],
    anchors: Anchors,
    allowed: Callable[[str], bool],
) -> list[str]:
    """Where ``__has_include`` probes that name a path — absolute, or with ``..`` —
    looked. Every such place must lie under a root (its answer is then recorded like
    any negative lookup); one outside every root is refused, since whether a file
    exists there is not a declared input of the build. (A ``..`` probe that walks out
    of one of the toolchain's own include dirs is the one exception: it is not
    recorded — as a header added to the system would not be.)"""
    out: list[str] = []
    roots = list(anchors.roots.values())
    resolved: dict[str, bool] = {}  # (directory -> whether a link is on its way)
    own_dirs = [d for d in search_dirs if not _toolchain_dir(d, anchors)]  # (once, not per probe)
    for kind, name, here in probes:
        if not name:
            continue
        if not (name.startswith("/") or ".." in name.split("/")):
            # A plain name stays where it is looked for — unless a link on the way leads
            # out of the roots (whether its target is there or not: refused either way,
            # as an #include of it is). Its answer is a negative lookup like any other.
            first = [here] if kind == '"' and here else []
            first = [d for d in first if not _toolchain_dir(d, anchors)]
            looked = [os.path.join(d, name) for d in (*first, *own_dirs)]
            if first_outside([p for p in looked if _linked(p, resolved)], roots) is not None:
                logger.debug("refused: __has_include(%r) leads out of the roots through a link", name)
                raise UndeclaredDependencyError(LOOKED_OUTSIDE)
            continue
        if name.startswith("/"):
            places = [(name, False)]
        elif kind == '"' and not here and not _within_scratch(name):
            # The main source's: looked for next to it first, in <scratch>/<work dir>/src,
            # from where more ".." than that leads out of the scratch and of every root.
            logger.debug("refused: __has_include(%r) in the source looks outside every root", name)
            raise UndeclaredDependencyError(LOOKED_OUTSIDE)
        else:
            first = [here] if kind == '"' and here else []
            places = [(os.path.join(d, name), _toolchain_dir(d, anchors)) for d in (*first, *search_dirs)]
        for place, system in places:
            for cand in (place, place + PCH_SUFFIX):
                real = os.path.realpath(cand)
                if allowed(real):
                    out.append(real)
                elif not system:
                    # (the words a failed compile gives when it could not open one)
                    logger.debug("refused: __has_include(%r) probes %r, outside every root", name, cand)
                    raise UndeclaredDependencyError(LOOKED_OUTSIDE)
    return out


def _linked(path: str, resolved: dict[str, bool]) -> bool:
    """Whether ``path`` is a link, or lies in a directory reached through one (``resolved``:
    what is known of directories so far)."""
    head = os.path.dirname(path)
    through = resolved.get(head)
    if through is None:
        through = resolved[head] = os.path.realpath(head) != os.path.normpath(head)
    return through or os.path.islink(path)


def _within_scratch(name: str) -> bool:
    """Whether ``name``, looked for next to the staged source (``<scratch>/<work dir>/src``),
    stays within the scratch dir, where only this library names entries."""
    return os.path.normpath(os.path.join("/scratch/work/src", name)).startswith("/scratch/")


def _toolchain_dir(path: str, anchors: Anchors) -> bool:
    found = anchors.anchor(path)
    return found is not None and found[0].startswith("t")


def _directories(files: Sequence[str], anchors: Anchors) -> list[str]:
    """Every directory from each file up to the root it lies under."""
    roots = sorted(anchors.roots.values(), key=len, reverse=True)
    seen: set[str] = set()
    for path in files:
        top = next((r for r in roots if is_under(path, r)), None)
        here = os.path.dirname(path)
        while top is not None and here not in seen and is_under(here, top):
            seen.add(here)
            if here == top:
                break
            here = os.path.dirname(here)
    return sorted(seen)
