"""The lookup recorder (``lookups.c``): every path a process looks up, failed lookups
included, complete by construction.

A process that loads it and calls :meth:`Recorder.install` can make path syscalls
only through the recorder's SIGSYS handler, which makes each call on its behalf and
writes it down (see ``lookups.c``). The NVRTC worker records each compile this way:
what it read, and what it looked for and did not find (negative dependencies).

Preloaded into a compiler run (:func:`preload_env`), it records the preprocessors
(GCC's ``cc1``, ``cc1plus``: the host compiler's, and the one nvcc runs; clang's
``clang -cc1``) and GNU as (what inline asm's ``.incbin`` and ``.include`` name),
each appending its records to :data:`PRELOAD_FILE` in the run's directory as it makes
them (:func:`read_preloaded`).

Linux on x86_64 and aarch64 only, with seccomp filters; built once per user by the
system C compiler (:func:`build`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
import sys
from dataclasses import dataclass
from typing import Final

from ..closure.hashing import open_regular
from ._shim_build import ensure_lookups
from .statedir import StateDir

__all__ = [
    "KINDS",
    "PRELOAD_FD",
    "PRELOAD_FILE",
    "Lookup",
    "LookupsLost",
    "Recorder",
    "Records",
    "TooManyLookups",
    "build",
    "keep_records",
    "parse",
    "preload_env",
    "read_preloaded",
    "supported",
]

#: What a record's kind number stands for (``lookups.c``'s ``K_*``).
KINDS: Final = {1: "open", 2: "stat", 3: "lstat", 4: "access", 5: "readlink", 6: "statfs", 7: "chdir"}
_HEAD: Final = struct.Struct("<IiqI")
_MACHINES: Final = ("x86_64", "aarch64")


@dataclass(frozen=True, slots=True)
class Lookup:
    kind: str
    path: str
    #: 0 when the lookup succeeded, else its errno.
    error: int
    #: The open flags (``open``), the ``*at`` flags (``stat``, ``lstat``), the mode (``access``).
    flags: int


class LookupsLost(ValueError):
    """More lookups than the recorder's buffer holds: what was looked up past them is
    unknown (a source can make that many on purpose, to hide one)."""


class TooManyLookups(LookupsLost):
    """More distinct paths looked up than a compile may make (:class:`Records`' ``limit``):
    walking each costs this process time and memory the compiler's limits do not bound
    (thousands of ``__has_include`` probes, each in every include dir)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} distinct paths")
        self.limit = limit


def supported() -> bool:
    """Whether this machine can run the recorder: Linux on x86_64 or aarch64, with
    seccomp filters (a kernel that has them says so in ``/proc/self/status``)."""
    if platform.machine() not in _MACHINES:
        return False
    try:
        with open("/proc/self/status", "rb") as status:
            return b"\nSeccomp:" in status.read()
    except OSError:
        return False


def build(state: StateDir | None, cc: str | None) -> str | None:
    """The recorder's shared object in the private ``state`` dir, built if need be;
    None when it cannot be here."""
    return ensure_lookups(state, cc) if state is not None and supported() else None


def parse(data: bytes) -> list[Lookup]:
    """The records ``lookups_end`` returned. Raises ``ValueError`` on a malformed one."""
    out: list[Lookup] = []
    at, end = 0, len(data)
    while at < end:
        if end - at < _HEAD.size:
            raise ValueError("a truncated lookup record")
        size, kind, result, flags = _HEAD.unpack_from(data, at)
        if size < _HEAD.size or at + size > end or kind not in KINDS:
            raise ValueError("a malformed lookup record")
        path = os.fsdecode(data[at + _HEAD.size : at + size])
        out.append(Lookup(KINDS[kind], path, -result if result < 0 else 0, flags))
        at += size
    return out


#: Where a preloaded recorder writes, in the run's directory (its cwd).
PRELOAD_FILE: Final = "safejit-lookups.rec"
#: Where each run's processes find the recorder open (shim.c's ``-L``).
PRELOAD_FD: Final = 200
#: The most records read back from a run: past it, what was looked up is lost.
_PRELOAD_MAX: Final = 256 << 20
#: What a lookup's result says of the path: there (the lookup found it; a readlink of
#: what is no link), or not (nothing by that name, or a file where a directory was named).
_THERE: Final = frozenset({0, errno.EINVAL})
_NOT_THERE: Final = frozenset({errno.ENOENT, errno.ENOTDIR})
#: A lookup the sandbox refused (Landlock): of a path there, outside every root.
_REFUSED: Final = frozenset({errno.EACCES, errno.EPERM})
_FS_ENCODING: Final = sys.getfilesystemencoding()
_FS_ERRORS: Final = sys.getfilesystemencodeerrors()


def preload_env(library: str) -> dict[str, str] | None:
    """The environment that preloads ``library`` into a run; None when its path cannot
    be preloaded (the loader splits ``LD_PRELOAD`` at blanks and colons)."""
    if any(c in library for c in " \t\n:"):
        return None
    return {"LD_PRELOAD": library, "SAFEJIT_LOOKUPS": PRELOAD_FILE}


def read_preloaded(
    cwd: str, *, killed: bool = False, early: Records | None = None
) -> tuple[tuple[str, bool | None], ...] | None:
    """``(path, found)`` for each path the preprocessors of a run in ``cwd`` looked up
    (opens to read, stats, access and readlink checks; ``cwd`` itself and what lies
    in it aside), in order, once each; found is None when lookups of it disagreed (it
    was made or removed meanwhile) or failed another way (a name too long, a loop of
    links), True for one the sandbox refused (there, outside every root). None when
    nothing was recorded (no preprocessor ran with the recorder).

    Raises ``LookupsLost`` past :data:`_PRELOAD_MAX` (a source can make that many
    lookups, to hide one), ``ValueError`` when the records cannot vouch for the run: a
    preprocessor that did not finish, records cut short, a file that is no regular
    file (the compiler wrote it: read never through a link, never blocking).
    ``killed``: the run was killed (at its time limit): what its preprocessors recorded
    before, each lookup written down before the program saw its result; a torn last
    record is one whose result it never saw. ``early``: the records as read while the
    run went on (:class:`Records`), of which only what was added since is read again."""
    try:
        data = _read_records(cwd)
    except OSError as exc:
        raise ValueError(f"the recorded lookups cannot be read: {exc.strerror}") from None
    if data is None:
        return None
    records = early if early is not None and early.cwd == cwd else Records(cwd)
    records.feed(data)
    return records.found(killed=killed)


class Records:
    """The records of a run in ``cwd``, read as its file grows (:meth:`feed` each time
    with all of it): each record is read once."""

    __slots__ = ("_begun", "_data", "_ended", "_paths", "_refused", "_said_of", "_torn", "cwd", "limit")

    def __init__(self, cwd: str, limit: int | None = None) -> None:
        self.cwd = cwd
        #: The most distinct paths the run may look up (None: no limit); past it
        #: :meth:`feed` raises ``TooManyLookups``, and nothing more is read.
        self.limit = limit
        self._paths: dict[bytes, str | None] = {}  # (each name as a path; None: the run's own)
        self._reset()

    def _reset(self) -> None:
        self._data = b""  # (the whole records read, up to the last)
        # (each name once, as bytes: most are looked up more than once — an open, then a
        # stat; the same header in each include dir — and decoding is the dearer part)
        self._said_of: dict[bytes, bool | None] = {}
        self._refused: dict[bytes, None] = {}  # (names the sandbox refused, in order)
        self._begun = self._ended = 0
        self._torn = False  # (the data ends in a part of a record)

    def feed(self, data: bytes) -> None:
        """The file's content now. Raises ``LookupsLost`` past the cap (``TooManyLookups``
        past ``limit``), ``ValueError`` for a record no recorder writes."""
        if len(data) > _PRELOAD_MAX:
            raise LookupsLost("more lookups than the recorder's file may hold")
        if not data.startswith(self._data):  # (not what it held before: read afresh)
            self._reset()
        at, end = len(self._data), len(data)
        said_of, unpack = self._said_of, _HEAD.unpack_from
        self._torn = False
        while at < end:
            size, kind, result, flags = unpack(data, at) if end - at >= _HEAD.size else (0, 0, 0, 0)
            if end - at < _HEAD.size or at + size > end:  # (the last, being written, or torn by a kill)
                self._torn = True
                break
            if size < _HEAD.size or (kind != 0 and kind not in KINDS):
                raise ValueError("the recorded lookups are malformed")
            if kind == 0:  # (a process's begin record, result 1, and its end record, result 0)
                self._begun += result == 1
                self._ended += result == 0
            elif kind < 6 and (kind != 1 or (flags & (os.O_ACCMODE | os.O_CREAT)) == os.O_RDONLY):
                # (not statfs, chdir, nor an open to write; kind 1 is "open", 5 "readlink")
                error = -result if result < 0 else 0
                there = (error in _THERE if kind == 5 else error == 0) or error in _REFUSED
                # (any other error — a name too long, a loop of links, a FIFO — says something
                # of what is there too: None, as a path whose lookups disagreed)
                said = there if there or error in _NOT_THERE else None
                name = data[at + _HEAD.size : at + size]
                if error in _REFUSED:
                    self._refused[name] = None
                was = said_of.setdefault(name, said)
                if was is not None and was != said:
                    said_of[name] = None
                if self.limit is not None and len(said_of) > self.limit:
                    raise TooManyLookups(self.limit)
            at += size
        self._data = data[:at]

    def found(self, *, killed: bool = False) -> tuple[tuple[str, bool | None], ...]:
        """``(path, found)`` as :func:`read_preloaded` gives them. Raises ``ValueError``
        unless ``killed`` when the records cannot vouch for the run (cut short, or a
        process with no end record)."""
        if not killed and (self._torn or not self._ended or self._begun != self._ended):
            raise ValueError("the recorded lookups are cut short or incomplete: a preprocessor did not finish")
        found: dict[str, bool | None] = {}
        paths = self._paths
        for name, said in self._said_of.items():
            path = paths[name] if name in paths else self._path(name)
            if path is not None:
                was = found.setdefault(path, said)
                if was is not None and was != said:
                    found[path] = None
        return tuple(found.items())

    def refused(self) -> list[str]:
        """The paths whose lookup the sandbox refused (EACCES, EPERM): a file there that
        the compiler was handed as not there (``lookups.c``)."""
        paths = self._paths
        found = [paths[name] if name in paths else self._path(name) for name in self._refused]
        return [p for p in found if p is not None]

    def _path(self, name: bytes) -> str | None:
        """The path ``name`` names (from the run's dir when relative); None for one in the
        run's dir (its own files)."""
        path = name.decode(_FS_ENCODING, _FS_ERRORS)  # (os.fsdecode's)
        if path[:1] != "/":
            path = os.path.join(self.cwd, path)
        # (the work dir is ours: no link in it; most names need no normalizing)
        own = (os.path.normpath(path) if "/." in path or "//" in path else path) + "/"
        self._paths[name] = got = None if own.startswith(self.cwd.rstrip("/") + "/") else path
        return got


def _read_records(directory: str) -> bytes | None:
    """The records file in ``directory`` (None: there is none), up to :data:`_PRELOAD_MAX`
    and a byte more (past it, the records are lost). Raises ``OSError`` when it cannot be
    read, or is no regular file (the compiler wrote it: never read through a link, never
    blocking on a FIFO)."""
    try:
        fd, st = open_regular(os.path.join(directory, PRELOAD_FILE), nofollow=True)
    except FileNotFoundError:
        return None
    try:
        return _read_capped(fd, st.st_size)
    finally:
        os.close(fd)


def _read_capped(fd: int, size: int) -> bytes:
    """What ``fd`` holds, up to :data:`_PRELOAD_MAX` and a byte more; in reads of its
    size (a buffer of the cap cost ~25 us a compile)."""
    chunks, got = [], 0
    while got <= _PRELOAD_MAX:
        chunk = os.read(fd, min(max(size - got, 0) + 1, _PRELOAD_MAX + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def keep_records(scratch: str, cwd: str) -> None:
    """Copy the records a killed run left in its ``scratch`` into ``cwd`` (which its
    scratch was mounted on), where :func:`read_preloaded` reads them. Records that
    cannot be copied whole are left as one unreadable record (never as fewer lookups:
    the run's output is then withheld)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    kept = os.path.join(cwd, PRELOAD_FILE)
    try:
        data = _read_records(scratch)  # (past the cap, the reader says they were lost)
        if data is None:
            return
        with open(os.open(kept, flags, 0o600), "wb") as out:
            out.write(data)
    except OSError:
        with contextlib.suppress(OSError), open(os.open(kept, flags, 0o600), "wb") as out:
            out.write(bytes(_HEAD.size))


class Recorder:
    """The recorder loaded into this process. :meth:`install` is for good: only a
    process that does nothing but the work to record (the NVRTC worker) calls it."""

    def __init__(self, library: str) -> None:
        self._lib = ctypes.CDLL(library)
        self._lib.lookups_install.restype = ctypes.c_int
        self._lib.lookups_end.restype = ctypes.c_long
        self._lib.lookups_end.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def install(self) -> None:
        """Trap this process's path syscalls from now on. Raises ``OSError``."""
        rc = int(self._lib.lookups_install())
        if rc != 0:
            raise OSError(-rc, f"the lookup recorder cannot be installed: {os.strerror(-rc)}")

    def begin(self) -> None:
        self._lib.lookups_begin()

    def end(self) -> list[Lookup]:
        """What was looked up since :meth:`begin`. Raises ``OSError(E2BIG)`` when the
        records overflowed their buffer."""
        where = ctypes.c_void_p()
        size = int(self._lib.lookups_end(ctypes.byref(where)))
        if size < 0:
            raise OSError(errno.E2BIG, "more lookups than the recorder's buffer holds")
        return parse(ctypes.string_at(where, size)) if size else []
