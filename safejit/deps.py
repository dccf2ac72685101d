"""Dependency closures: depfile parsing, anchors, file digests, stat snapshots.

A dependency is recorded as ``(anchor, relpath, digest)``. Anchors name the
declared roots (``s0``, ``s1``… for source roots, ``t0``… for toolchain
roots), so a second checkout at another path records the same closure.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import blake3

__all__ = [
    "RACY_WINDOW_NS",
    "Anchors",
    "Dep",
    "Snapshot",
    "hash_file",
    "hash_opened",
    "make_unescaped",
    "open_regular",
    "parse_depfile",
    "parse_listing",
    "parse_single_rule",
    "read_output",
    "snapshot_of",
]

#: A file whose mtime/ctime is this close to "now" may still change within the
#: same filesystem timestamp tick, so its stat cannot vouch for its content
#: (git's "racily clean" problem). Such files are rehashed, never stat-trusted.
RACY_WINDOW_NS: Final = 2_000_000_000
_TOKEN = re.compile("\0([a-z][0-9]+)\0")
#: An empty, ``.`` or ``..`` path component.
_BAD_REL = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")

_PARALLEL_BYTES: Final = 1 << 20
Snapshot = tuple[int, int, int, int, int]  # dev, ino, size, mtime_ns, ctime_ns


def snapshot_of(st: os.stat_result) -> Snapshot:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_racy(snap: Snapshot, now_ns: int | None = None) -> bool:
    now = time.time_ns() if now_ns is None else now_ns
    return now - max(snap[3], snap[4]) < RACY_WINDOW_NS


@dataclass(frozen=True, slots=True)
class Dep:
    anchor: str
    relpath: str
    digest: str

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.anchor, self.relpath, self.digest)


def open_regular(path: str, *, nofollow: bool = False) -> tuple[int, os.stat_result]:
    """An fd open for reading on the regular file ``path``, and its stat. Never blocks
    on a FIFO (one planted where a file was would hang every reader), never makes a
    terminal this process's: anything but a regular file raises ``OSError``; so does a
    symlink with ``nofollow``."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | (os.O_NOFOLLOW if nofollow else 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


#: BLAKE3's threads (a Rayon pool) do not survive fork: a child of a process that used
#: them would wait on them forever. Such a child hashes on one thread.
_threads_used = False
_threads_gone = False


def _threads() -> int:
    global _threads_used
    if _threads_gone:
        return 1
    _threads_used = True
    return int(blake3.blake3.AUTO)


def _after_fork_in_child() -> None:
    global _threads_gone
    _threads_gone = _threads_gone or _threads_used


os.register_at_fork(after_in_child=_after_fork_in_child)


def hash_file(path: str, *, nofollow: bool = False) -> tuple[str, Snapshot]:
    """BLAKE3 of a regular file's bytes and its stat, taken *before* reading.

    Stat-then-read means a concurrent edit can only make the snapshot look
    older than the digest, which forces a rehash later — never a stale pass.
    With ``nofollow`` a symlink raises ``OSError(ELOOP)``.
    """
    fd, st = open_regular(path, nofollow=nofollow)
    try:
        return _hash_fd(fd, st), snapshot_of(st)
    finally:
        os.close(fd)


def _hash_fd(fd: int, st: os.stat_result) -> str:
    # Large files hash on every core (BLAKE3's tree mode); small ones on one.
    h = blake3.blake3(max_threads=_threads()) if st.st_size >= _PARALLEL_BYTES else blake3.blake3()
    for chunk in _chunks(fd, st):
        h.update(chunk)
    return h.hexdigest()


def _chunks(fd: int, st: os.stat_result) -> Iterator[bytes]:
    """The file's bytes, up to the size its stat gave. More than that (a file still
    being written, or a /proc or /sys file, whose size says nothing of what can be read
    from it, endlessly) raises ``OSError``: what it holds is not what was stat'ed."""
    left = st.st_size + 1
    while left > 0 and (chunk := os.read(fd, min(max(left, 1 << 16), 1 << 24))):
        left -= len(chunk)
        yield chunk
    if left <= 0:
        raise OSError(errno.EAGAIN, "holds more than its size says (changing, or no ordinary file)")


def hash_opened(path: str, allowed: Callable[[str], bool]) -> tuple[str, Snapshot] | None:
    """:func:`hash_file` following symlinks, of a file whose resolved path is
    ``allowed``; None when it is not, before it is opened for reading (a terminal, a
    FIFO's writer are never touched). The path is that of the very file then read:
    found through an ``O_PATH`` descriptor, which is then opened again (a symlinked dir
    swapped meanwhile cannot make it another)."""
    pathfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        try:
            real = os.readlink(f"/proc/self/fd/{pathfd}")
            target = f"/proc/self/fd/{pathfd}"
        except OSError:  # (no /proc)
            real = target = os.path.realpath(path)
        if not allowed(real):
            return None
        fd, st = open_regular(target)
    finally:
        os.close(pathfd)
    try:
        return _hash_fd(fd, st), snapshot_of(st)
    finally:
        os.close(fd)


def read_file(path: str) -> tuple[bytes, Snapshot]:
    """A regular file's bytes and its stat, taken before reading."""
    fd, st = open_regular(path)
    try:
        return _read_all(fd, st), snapshot_of(st)
    finally:
        os.close(fd)


def _read_all(fd: int, st: os.stat_result) -> bytes:
    return b"".join(_chunks(fd, st))


def read_output(path: str) -> bytes:
    """A file a sandboxed process wrote (artifact, depfile), read without trusting it:
    never through a symlink, never blocking on a FIFO. Anything but a regular file
    raises ``OSError``."""
    fd, st = open_regular(path, nofollow=True)
    try:
        return _read_all(fd, st)
    finally:
        os.close(fd)


def parse_depfile(text: str) -> list[str]:
    """Prerequisites of every rule in a Make depfile, in order, deduplicated.

    Handles ``\\``-newline continuations, ``\\ `` escaped spaces, ``\\#`` and
    ``$$``, and rules with no prerequisites (``a.o:``).
    """
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    seen: set[str] = set()
    # Lines end at "\n" only: str.splitlines would also end one at \f, \v, \x1c..., which
    # a name may hold.
    for line in joined.split("\n"):
        if not line or (line[-1] == ":" and " " not in line and "\t" not in line):
            continue  # a rule with nothing after its target (a linker lists one per file)
        for word in _prerequisites(line.removesuffix("\r")):
            if word not in seen:
                seen.add(word)
                out.append(word)
    return out


def parse_single_rule(text: str) -> list[str]:
    """Prerequisites of a depfile that must hold exactly one rule and no control
    character (the assembler's: it lists names from the source's ``.file``
    directives verbatim, so a control character could hide the rest of a line).
    Raises ``ValueError`` otherwise."""
    joined = text.replace("\\\n", " ")
    if _CONTROL.search(joined):
        raise ValueError("a control character in the depfile")
    lines = [line for line in joined.split("\n") if line.strip()]
    if len(lines) != 1 or not _is_rule(lines[0]):
        raise ValueError(f"{len(lines)} rules in a depfile that must hold one")
    return parse_depfile(lines[0])


def parse_listing(text: str) -> list[str]:
    """The names in a linker's list of what it read (``--dependency-file``): the output,
    ``:``, then `` \\``, a newline, two spaces and a name for each file; then a phony
    rule per name. GNU ld writes the names raw (a space, ``#``, ``$`` are part of a
    name), so they are split at those continuations only. Raises ``ValueError`` on a
    control character or when the list starts otherwise."""
    if _CONTROL.search(text):
        raise ValueError("a control character in the list")
    first = text.partition("\n\n")[0].removesuffix("\n")
    target, *names = first.split(" \\\n  ")
    if not target.endswith(":") or "\n" in target or any("\n" in name or not name for name in names):
        raise ValueError("not a linker's list")
    return list(dict.fromkeys(names))


def make_unescaped(name: str) -> str:
    """A name as Make reads it (``\\ `` a space, ``\\#`` a ``#``, ``$$`` a ``$``): how lld
    writes its list, where GNU ld writes names raw."""
    words = _split_words(name)
    return words[0][0] if len(words) == 1 else name


#: Control characters but tab and newline.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _is_rule(line: str) -> bool:
    if "\\" not in line and "$" not in line:
        return any(word.endswith(":") for word in line.replace("\t", " ").split(" "))
    return _has_colon(_split_words(line))


def _prerequisites(line: str) -> list[str]:
    """The words after a rule's target, or none when the line is no rule."""
    if "\\" not in line and "$" not in line:
        # Nothing escaped (what compilers write for ordinary paths): a plain split says the same.
        plain = [w for w in line.replace("\t", " ").split(" ") if w]
        for i, word in enumerate(plain):
            if word.endswith(":"):
                return plain[i + 1 :]
        return []
    words = _split_words(line)
    # The target ends at the first word that ends with an unescaped ':'.
    for i, (_, colon) in enumerate(words):
        if colon:
            return [w for w, _ in words[i + 1 :] if w]
    return []


def _split_words(line: str) -> list[tuple[str, bool]]:
    """Split on unescaped whitespace; flag words that end a target (``x:``)."""
    words: list[tuple[str, bool]] = []
    cur: list[str] = []
    i, n = 0, len(line)

    def flush(colon: bool) -> None:
        if cur or colon:
            words.append(("".join(cur), colon))
            cur.clear()

    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] in " \t#\\":
            cur.append(line[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < n and line[i + 1] == "$":
            cur.append("$")
            i += 2
            continue
        if c in " \t":
            flush(False)
        elif c == ":" and (i + 1 == n or line[i + 1] in " \t") and not _has_colon(words):
            flush(True)
        else:
            cur.append(c)
        i += 1
    flush(False)
    return words


def _has_colon(words: Sequence[tuple[str, bool]]) -> bool:
    return any(colon for _, colon in words)


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
        if _BAD_REL.search(relpath):
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


_HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?\s*\(\s*[<"]([^>"\n]+)[>"]\s*\)')
_QUOTED_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)


def quoted_includes(data: bytes) -> list[str]:
    """Names in ``#include "..."`` lines: searched next to the including file first."""
    if b'include "' not in data and b"include\t" not in data:
        return []
    return [m.group(1).decode("utf-8", "replace") for m in _QUOTED_INCLUDE.finditer(data)]


def has_include_names(data: bytes) -> list[str]:
    """Header names probed with ``__has_include`` (literal arguments only)."""
    if b"__has_include" not in data:
        return []
    return [m.group(1).decode("utf-8", "replace").strip() for m in _HAS_INCLUDE.finditer(data)]


class Absence:
    """``absence(path)``: whether ``path`` does not exist now. Many candidates share a
    parent that does not exist (dir_0/bits/...): one lstat says so for all of them."""

    __slots__ = ("_parents",)

    def __init__(self) -> None:
        self._parents: dict[str, bool] = {}

    def __call__(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        there = self._parents.get(parent)
        if there is None:
            there = self._parents[parent] = os.path.lexists(parent)
        return not there or not os.path.lexists(path)


def negative_lookups(
    deps: Sequence[str], search_dirs: Sequence[str], probes: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Paths that must stay absent for the build to stay valid; and those of the same
    kind that are there, yet were not read (made during the compile? the caller checks).

    * Shadowing: a dependency found as ``dir_N/rel`` must not appear as
      ``dir_i/rel`` for any earlier search directory ``i < N``.
    * ``__has_include`` names that resolved nowhere must not appear in any
      search directory (nor next to the file that probed them).

    Over-approximates where the include name is ambiguous (nested search
    dirs): a spurious entry can only cause a rebuild, never a stale hit.
    """
    dirs = [d.rstrip("/") for d in search_dirs]
    out: set[str] = set()
    present: set[str] = set()
    found: set[str] = set(deps)
    absent = Absence()
    for path in deps:
        for n, d in enumerate(dirs):
            if not path.startswith(d + "/"):
                continue
            rel = path[len(d) + 1 :]
            for earlier in dirs[:n]:
                cand = f"{earlier}/{rel}"
                if cand not in found:
                    (out if absent(cand) else present).add(cand)
    for name in probes:
        if not name or name.startswith("/") or _BAD_REL.search(name):
            continue
        cands = [f"{d}/{name}" for d in dirs]
        if any(c in found for c in cands):
            continue  # resolved: shadowing is covered above
        for c in cands:
            (out if absent(c) else present).add(c)
    return sorted(out), sorted(present)
