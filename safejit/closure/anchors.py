"""Anchors: named declared roots, and the mapping between paths and ``(anchor, relpath)``.

A dependency is recorded as ``(anchor, relpath, digest)``. Anchors name the
declared roots (``s0``, ``s1``… for source roots, ``t0``… for toolchain
roots, ``c0``… cache roots, ``l0``… the linker's library dirs), so a second
checkout at another path records the same closure. :class:`Walk` walks a path as
the kernel does, to tell whether a compiler's lookup left the roots on its way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

__all__ = [
    "BAD_REL",
    "LINK_ANCHOR",
    "LOOKED_OUTSIDE",
    "Anchors",
    "Walk",
    "climbs_out",
    "encodable",
    "first_outside",
    "is_under",
    "real_path",
]


def encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode a file, an argument, a key or a manifest can hold
    (no lone surrogate: a name that is not UTF-8, decoded with surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_TOKEN = re.compile("\0([a-z][0-9]+)\0")
#: An empty, ``.`` or ``..`` path component.
BAD_REL: Final = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
#: The anchors of roots that only what the linker reads may lie under (``l0``…).
LINK_ANCHOR: Final = "l"


def is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def real_path(path: str, *, strict: bool = False) -> str:
    """``os.path.realpath`` of an existing file or directory, from the kernel: three
    system calls, where realpath takes one ``lstat`` per path component. realpath when
    that fails (no /proc); ``strict``: ``OSError`` when ``path`` does not exist."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path, strict=strict)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    finally:
        os.close(fd)
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return os.path.realpath(path, strict=strict)
    return real


class Anchors:
    """Named roots, and the mapping between paths and ``(anchor, relpath)``.

    Roots are given already resolved (realpath); the longest root wins.
    """

    def __init__(self, roots: Mapping[str, str]) -> None:
        self._roots = dict(roots)
        self._order = sorted(self._roots.items(), key=lambda kv: len(kv[1]), reverse=True)
        self._anchored: dict[str, tuple[str, str] | None] = {}  # anchor() is pure: strings only

    @property
    def roots(self) -> Mapping[str, str]:
        return self._roots

    def anchor(self, path: str) -> tuple[str, str] | None:
        """``(anchor, relpath)`` for an absolute path under a root, else None."""
        try:
            return self._anchored[path]
        except KeyError:
            pass
        if len(self._anchored) >= 65_536:
            self._anchored.clear()
        found = self._anchored[path] = self._anchor(path)
        return found

    def anchor_in(self, path: str, prefix: str) -> tuple[str, str] | None:
        """:meth:`anchor` among the roots whose anchor starts with ``prefix`` only."""
        return self._anchor(path, prefix)

    def _anchor(self, path: str, prefix: str = "") -> tuple[str, str] | None:
        norm = os.path.normpath(path)
        for name, root in self._order:
            if not name.startswith(prefix):
                continue
            if norm == root:
                return (name, ".")
            if norm.startswith(root.rstrip("/") + "/"):
                return (name, norm[len(root.rstrip("/")) + 1 :])
        return None

    def expand(self, anchor: str, relpath: str) -> str | None:
        """The absolute path of an anchored path, or None when it is unknown or
        escapes its root lexically (``..``, absolute). Symlinks are checked
        by the caller's confinement, not here."""
        root = self._roots.get(anchor)
        if root is None or os.path.isabs(relpath) or "\0" in relpath:
            return None
        if relpath == ".":
            return root
        if BAD_REL.search(relpath):
            return None
        return f"{root}/{relpath}" if root != "/" else f"/{relpath}"

    def anchor_all(self, paths: Iterable[str]) -> list[tuple[str, tuple[str, str] | None]]:
        return [(p, self.anchor(p)) for p in paths]

    @staticmethod
    def token(anchor: str, relpath: str) -> str:
        """Anchored path as text for argv templates: NUL never occurs in argv."""
        return f"\0{anchor}\0" + ("" if relpath == "." else "/" + relpath)

    def expand_text(self, text: str) -> str:
        """Replace every anchored token in ``text`` with its root."""
        if "\0" not in text:
            return text
        return _TOKEN.sub(lambda m: self._roots[m.group(1)], text)


def first_outside(paths: Iterable[str], roots: Iterable[str]) -> str | None:
    """The first of ``paths`` (absolute; looked up by a compiler, there or not) that leads
    outside every one of ``roots`` (resolved): by name, or through a symlink on its way
    (the directory it is in, resolved once each) or at its end."""
    under = tuple(r.rstrip("/") + "/" for r in roots)
    parents: dict[str, str] = {}
    for path in paths:
        norm = os.path.normpath(path)
        if os.path.islink(norm):
            real = os.path.realpath(norm)
        else:
            head, tail = os.path.split(norm)
            if head not in parents:
                parents[head] = os.path.realpath(head)
            real = os.path.join(parents[head], tail)
        if not (real + "/").startswith(under):
            return path
    return None


def climbs_out(path: str, roots: Sequence[str], *, spelled: Sequence[str] = (), ours: str | None = None) -> bool:
    """Whether ``path`` (absolute; looked up by a compiler) leads outside every one of
    ``roots`` (resolved) and ``ours`` on its way or at its end, walked as the kernel
    walks it (:class:`Walk`). For one path; :class:`Walk` for many."""
    return Walk(roots, spelled=spelled).leads_out(path, ours=ours)


class Walk:
    """Paths walked as the kernel walks them, a name at a time from ``/``: each link
    followed by its text where it is met (a part of its target not there is not taken
    for there, as ``os.path.realpath`` takes it), each ``..`` taken where the walk is by
    then. A path leads out when the walk looks a name up in a dir outside every root
    that is no ancestor of one (whether that name is there says something of the world
    outside; an ancestor's entries on the way to a root are known to be there), or ends
    outside one. A name in ``/proc`` is outside: a process's ``cwd`` or ``root`` there
    means the compiler's, not this process's. Past the include dir a path starts with as
    the compiler spells it (``spelled``: ``/usr/lib/gcc/<triple>/12/../../../../include``,
    whose ``..`` are the compiler's own). What is resolved is kept for the next path."""

    __slots__ = ("_above_roots", "_roots", "_seen", "_spelled", "_system", "_under")

    def __init__(self, roots: Sequence[str], *, spelled: Sequence[str] = (), system: Sequence[str] = ()) -> None:
        # (``system``: the toolchain's roots, whose links are the system's, not a tenant's:
        # one is taken where it leads, as realpath takes it — /usr/include/cblas.h through
        # /etc/alternatives is found wherever the walk to it went)
        self._system = tuple(r.rstrip("/") + "/" for r in system)
        self._roots = frozenset(r.rstrip("/") or "/" for r in roots)
        self._under = tuple(r.rstrip("/") + "/" for r in self._roots)  # (str.startswith takes a tuple)
        self._above_roots = frozenset(_ancestors(self._roots))
        # (each with its trailing "/", the longest first: the first a path starts with is its base)
        self._spelled = tuple(sorted((d.rstrip("/") + "/" for d in spelled), key=len, reverse=True))
        self._seen: dict[tuple[str, str], str | None] = {}

    def leads_out(self, path: str, *, ours: str | None = None) -> bool:
        """Whether ``path`` leads outside every root and ``ours`` (a dir it may walk in
        as in a root: a work dir's parent)."""
        base = next((d for d in self._spelled if path.startswith(d)), "") if self._spelled else ""
        mine = os.path.realpath(ours) if ours is not None else ""
        here: str | None = os.path.normpath(base) if base else "/"
        for part in path[len(base) :].split("/"):
            here = self._step(here, part, mine, 0)
            if here is None:
                return True
        return here is None or not (self._inside(here, mine) or self._above(here, mine))

    def _inside(self, path: str, mine: str) -> bool:
        return path in self._roots or path.startswith(self._under) or bool(mine and is_under(path, mine))

    def _above(self, path: str, mine: str) -> bool:
        return path in self._above_roots or bool(mine and is_under(mine, path))

    def _step(self, here: str | None, part: str, mine: str, hops: int) -> str | None:
        """Where the walk is after ``part`` from the resolved dir ``here``; None: out."""
        if here is None or part in ("", "."):
            return here
        if part == "..":
            return os.path.dirname(here)
        key = (here, part) if not mine else (here + "\0" + mine, part)
        if key in self._seen:
            return self._seen[key]
        named = f"{here}/{part}" if here != "/" else f"/{part}"
        there: str | None = named
        if not (self._inside(named, mine) or self._above(named, mine)) or named.startswith("/proc/"):
            there = None
        else:
            try:
                target = os.readlink(named)
            except OSError:  # (no link: a dir, a file, nothing)
                target = None
            if target is not None and named.startswith(self._system):
                real = os.path.realpath(named)
                there = real if self._inside(real, mine) or self._above(real, mine) else None
            elif target is not None:
                if hops >= 40:  # (a loop of links: the kernel's ELOOP)
                    there = None
                else:
                    there = "/" if target.startswith("/") else here
                    for sub in target.split("/"):
                        there = self._step(there, sub, mine, hops + 1)
                        if there is None:
                            break
        self._seen[key] = there
        return there


def _ancestors(paths: Iterable[str]) -> set[str]:
    """Every dir above each of ``paths`` (absolute, normalized), ``/`` included."""
    found: set[str] = set()
    for path in paths:
        here = path
        while here != "/":
            here = os.path.dirname(here)
            if here in found:
                break
            found.add(here)
    return found


#: What a build that looked for a file outside every root is refused with: the same words
#: whether a file is there (the compiler was refused it) or not, and no name — which of a
#: source's outside lookups is named would say which of them exist (the first refused
#: stops the compiler; an absent one does not).
LOOKED_OUTSIDE: Final = (
    "the compiler looked for a file outside every declared root (an #include or __has_include of an "
    "absolute or '..' path, or through a link out of a root); declare its directory in Config.source_roots "
    "(which file it was is logged at DEBUG, logger 'safejit', for the operator)"
)
