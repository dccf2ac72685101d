"""Work directories made ahead of time, off the compile's critical path.

Allocating an inode (creating a file or a directory) is the slowest metadata
operation on a journalling filesystem: 0.05–1 ms each on this project's ext4
CI machines, against ~20 µs for a rename or for writing into an existing empty
file. A cold compile needs about ten (work dir, source, lock file, staging dir,
the three leaf files, build dirs). So once a compile is done, a background
thread prepares the next work directories (two: enough for compiles back to
back) with every directory and empty file they will need; a compile then only
renames and fills them. (Not while the compile runs: their fsyncs would slow
the compiler down.) A prepared file that is missing or not as made is simply
created the slow way (:func:`fsio.write_file`).

A prepared work directory (``<root>/v1/tmp/<owner token>-<uuid>/``, mode 0700;
the token's mark, ``<token>.alive`` in the user's private state dir, is locked while
its process lives, and the directory itself while a compile uses it)::

    .tmp/                 TMPDIR of the sandboxed compiler
    .lock                 empty: linked to ``locks/<build_key>.lock`` when that is new
    src/.source           empty: renamed to ``src/<filename>``
    leaf/                 the publish stage (0755): becomes ``deps-<D>/`` by rename
    leaf/artifact.<ext>   leaf/manifest.json   leaf/.committed      empty, 0644

Spares belong to the process that made them (a forked child makes its own),
are used within :data:`MAX_AGE_S` (well inside ``gc``'s age for staging
residue) and are deleted at exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, replace
from typing import Final

from .. import _forksafe
from .._background import background, settle
from .._proc import done, owner, sweep, use
from .fsio import group_writable, mkdir_shared, readable_by_group, remove_tree
from .layout import MANIFEST, MARKER, CacheLayout

__all__ = [
    "MAX_AGE_S",
    "Spares",
    "Staging",
    "Workdir",
    "background",
    "pristine",
    "remove_quietly",
    "settle",
]

logger = logging.getLogger(__name__)

#: A spare older than this is discarded, not used (``gc`` removes staging residue after a day).
MAX_AGE_S: Final = 600.0
SOURCE_BLANK: Final = ".source"
LOCK_BLANK: Final = ".lock"
STAGE: Final = "leaf"
TMP: Final = ".tmp"


def pristine(path: str) -> bool:
    """Whether ``path`` is a work directory as prepared (or partly prepared) and unused:
    only the layout above, every file empty. Anything else in ``tmp/`` is residue."""
    allowed_dirs = {TMP, "src", STAGE}
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        for dirpath, dirnames, filenames in os.walk(path):
            rel = os.path.relpath(dirpath, path)
            if rel == ".":
                if not set(dirnames) <= allowed_dirs or not set(filenames) <= {LOCK_BLANK}:
                    return False
            elif dirnames or (rel == TMP and filenames) or (rel == "src" and set(filenames) - {SOURCE_BLANK}):
                return False
            for name in filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if not stat.S_ISREG(st.st_mode) or st.st_size:
                    return False
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Workdir:
    """A compile's work directory; ``prepared`` when made ahead with its empty files.
    ``scratch`` is where the compiler works: ``path``, or a private directory in memory.
    ``synced``: the stage's entries (its empty leaf files) are durable already."""

    path: str
    prepared: bool
    scratch: str = ""
    synced: bool = False

    def __post_init__(self) -> None:
        if not self.scratch:
            object.__setattr__(self, "scratch", self.path)

    @property
    def src(self) -> str:
        return os.path.join(self.path, "src")

    @property
    def stage(self) -> str:
        return os.path.join(self.path, STAGE)

    @property
    def tmp(self) -> str:
        return os.path.join(self.path, TMP)


def _new_dir(base: str, marks: str | None) -> str:
    """A new directory (0700) of this process's under ``base`` (``<root>/v1/tmp``), named
    ``<owner token>-<uuid>``: ``gc`` leaves it alone while this process lives, whatever
    its age (a compile may take longer than ``gc --older-than``). The token's mark is
    kept in ``marks`` (the user's private state dir: one per process, however many cache
    roots it uses), else in ``base``."""
    path = os.path.join(base, f"{owner(marks or base)}-{uuid.uuid4().hex}")
    os.mkdir(path, 0o700)
    return path


def make(
    base: str,
    artifact_file: str,
    *,
    prepared: bool,
    scratch: bool = True,
    synced: bool = False,
    marks: str | None = None,
) -> Workdir:
    """A new work directory under ``base`` (``<root>/v1/tmp``); with ``prepared``, every
    directory and empty file a compile and its publish will fill (the compiler's own,
    ``src/`` and ``.tmp/``, only with ``scratch``: else it works in memory).

    ``synced`` (for a spare, made in the background): the empty leaf files and their
    directory are fsynced now, so that the publish's fsyncs have only the contents
    left to write (0.3 ms less for the first of them here), and the stage directory
    needs none unless its entries change.
    """
    path = _new_dir(base, marks)
    wd = Workdir(path, prepared, synced=prepared and synced)
    if prepared:
        blanks = [
            (os.path.join(wd.path, LOCK_BLANK), 0o666),
            (os.path.join(wd.stage, artifact_file), 0o644),
            (os.path.join(wd.stage, MANIFEST), 0o644),
            (os.path.join(wd.stage, MARKER), 0o644),
        ]
        if scratch:
            os.mkdir(wd.tmp, 0o700)
            os.mkdir(wd.src, 0o700)
            blanks.append((os.path.join(wd.src, SOURCE_BLANK), 0o600))
        group = group_writable(os.path.dirname(os.path.dirname(base)))  # (base: <root>/v1/tmp)
        mkdir_shared(wd.stage, group=group)
        for blank, mode in blanks:
            fd = os.open(blank, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            try:
                if group and mode != 0o600:  # (the leaf's files, and the lock's blank: the group's)
                    readable_by_group(fd)
                if synced and os.path.dirname(blank) == wd.stage:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if synced:
            fd = os.open(wd.stage, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return wd


_scratch_lock = _forksafe.Lock()
_scratch: dict[int, str | None] = {}  # pid -> this user's memory scratch base (None: none usable)


def memory_scratch() -> str | None:
    """This user's scratch directory on /dev/shm (0700, owned, not a link), made once per
    process; None where there is none. Directories that processes which have died left
    there are removed the first time a process uses it."""
    pid = os.getpid()
    with _scratch_lock:
        if pid not in _scratch:
            _scratch[pid] = _open_memory_scratch()
        return _scratch[pid]


def _open_memory_scratch() -> str | None:
    # Root's compilers run as another uid (sandbox.runner); where no user namespace lets
    # them search root's directories, they must pass through this one to their work
    # dir: it is 0711 (no listing, and the names below are unguessable), and named
    # apart from the private 0700 one.
    root = os.geteuid() == 0
    base = "/dev/shm/safejit-root" if root else f"/dev/shm/safejit-u{os.geteuid()}"
    mode = 0o711 if root else 0o700
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, mode)
        st = os.lstat(base)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) in (0o700, mode):
            os.chmod(base, mode)  # (a umask may have taken the search bits)
            st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != mode:
        logger.warning("%s is not a private directory; compiling in the cache root", base)
        return None
    sweep(base, "", remove_quietly)  # (what processes that ended left)
    return base


def with_scratch(wd: Workdir, base: str | None) -> Workdir:
    """``wd`` compiling in a fresh private directory under ``base`` (memory), if given."""
    if base is None:
        return wd
    scratch = os.path.join(base, f"{owner(base)}-{uuid.uuid4().hex}")
    os.mkdir(scratch, 0o700)
    os.mkdir(os.path.join(scratch, TMP), 0o700)
    os.mkdir(os.path.join(scratch, "src"), 0o700)
    return replace(wd, scratch=scratch)


def _taken(wd: Workdir) -> bool:
    """Whether the spare ``wd`` is still whole, now in use (``_proc.use``: a ``gc`` may
    be removing it) and its mtime made now (``gc`` judges an unused one's age by it)."""
    if use(wd.path):
        with contextlib.suppress(OSError):
            os.utime(wd.path)
            if stat.S_ISDIR(os.lstat(wd.stage).st_mode):
                return True
        done(wd.path)
    return False


class Spares:
    """At most ``keep`` prepared work directories per root, refilled in the background."""

    def __init__(self, artifact_file: str, *, keep: int = 2, scratch: bool = True, marks: str | None = None) -> None:
        self.marks = marks
        self.artifact_file = artifact_file
        self.keep = keep
        self.scratch = scratch  # False: compilers work in memory, so no src/ or .tmp/ here
        self._lock = threading.Lock()
        self._ready: dict[str, list[tuple[float, Workdir]]] = {}
        self._pending: dict[str, int] = {}
        self._closed = False  # (a compile that ends after close() makes no more)
        self._pid = os.getpid()
        # (at exit, or once the Runtime that made them is dropped without close())
        weakref.finalize(self, _discard, self._ready, self._lock, self._pid)

    def take(self, base: str) -> Workdir:
        """A prepared work directory under ``base``, in use (``_proc.use``) until it is
        released: a spare when one is ready, else one made now. (``refill`` prepares the
        next ones, best once a compile is done.)"""
        wd = None
        if os.getpid() == self._pid:
            with self._lock:
                ready = self._ready.get(base, [])
                while ready and wd is None:
                    made, cand = ready.pop()
                    if time.monotonic() - made < MAX_AGE_S and _taken(cand):
                        wd = cand
                    else:
                        background().submit(remove_quietly, cand.path)
        if wd is None:
            wd = make(base, self.artifact_file, prepared=True, scratch=self.scratch, marks=self.marks)
            use(wd.path)
        return wd

    def refill(self, base: str) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            missing = self.keep - len(self._ready.get(base, ())) - self._pending.get(base, 0)
            if missing <= 0 or self._closed:
                return
            self._pending[base] = self._pending.get(base, 0) + missing
        for _ in range(missing):
            background().submit(self._fill, base)

    def _fill(self, base: str) -> None:
        try:
            wd = make(base, self.artifact_file, prepared=True, scratch=self.scratch, synced=True, marks=self.marks)
        except OSError as exc:  # the caller's own attempt will report it
            logger.debug("could not prepare a work directory in %s: %s", base, exc)
            wd = None
        with self._lock:
            self._pending[base] -= 1
            if wd is not None and not self._closed:
                self._ready.setdefault(base, []).append((time.monotonic(), wd))
                wd = None
        if wd is not None:
            remove_quietly(wd.path)

    def discard_all(self) -> None:
        """Delete the spares, and make none from now on."""
        with self._lock:
            self._closed = True
        _discard(self._ready, self._lock, self._pid)


def _discard(ready: dict[str, list[tuple[float, Workdir]]], lock: threading.Lock, pid: int) -> None:
    """Delete the spares ``ready`` (a ``Spares``'s own, made by process ``pid``)."""
    if os.getpid() != pid:
        return
    with lock:
        doomed = [wd for each in ready.values() for _, wd in each]
        ready.clear()
    for wd in doomed:
        remove_quietly(wd.path)


def remove_quietly(path: str) -> None:
    """Delete a work or scratch dir (never following links), ignoring errors."""
    with contextlib.suppress(OSError):
        remove_tree(path, within=os.path.dirname(path))


class Staging:
    """A disk tier's work directories: prepared ahead (``Spares``), with the compiler's
    scratch in memory when asked (``memory``), deleted in the background after use;
    ``gc`` (and, for memory scratch, the next process) removes what a dead process
    left. ``artifact_file``: the leaf's artifact name, '' when no leaf is prepared."""

    def __init__(
        self, artifact_file: str, *, scratch: bool = True, memory: bool = False, marks: str | None = None
    ) -> None:
        self._marks = marks
        self._spares = Spares(artifact_file, scratch=scratch, marks=marks) if artifact_file else None
        #: Whether the scratch is in memory: asked for (``memory``), and seen at the first
        #: compile (a process that only hits the cache never looks at /dev/shm).
        self._memory: bool | None = None if memory else False

    def _in_memory(self) -> bool:
        if self._memory is None:
            self._memory = memory_scratch() is not None
            if self._memory and self._spares is not None:
                self._spares.scratch = False  # (compilers work in memory: no src/ or .tmp/ in spares)
        return self._memory

    def workdir(self, root: str) -> Workdir:
        """A work directory for one compile and its publish, prepared ahead when possible,
        with its scratch in memory when asked."""
        base = CacheLayout(root).tmp
        in_memory = self._in_memory()
        if self._spares is not None:
            wd = self._spares.take(base)
        else:
            wd = make(base, "", prepared=False, marks=self._marks)
            use(wd.path)
        try:
            return with_scratch(wd, memory_scratch() if in_memory else None)
        except OSError as exc:
            logger.debug("no scratch in memory (%s); compiling in the cache root", exc)
            return wd

    def scratch_in_cache(self, wd: Workdir) -> Workdir:
        """``wd`` with its compiler working in the cache root (itself), as every compile
        of this process from now on: the scratch in memory failed it (/dev/shm full)."""
        self._memory = False
        if self._spares is not None:
            self._spares.scratch = True
        return replace(wd, scratch=wd.path)

    def new_stage(self, root: str) -> str:
        """A stage of its own for a publish with no prepared work dir (a remote hit's
        backfill), in use (``_proc.use``) until :meth:`let_go`."""
        path = _new_dir(CacheLayout(root).tmp, self._marks)
        use(path)
        return path

    def let_go(self, path: str) -> None:
        done(path)

    def discard(self, path: str, root: str) -> None:
        with contextlib.suppress(OSError):
            remove_tree(path, within=CacheLayout(root).base)

    def _release(self, path: str, root: str) -> None:
        self.discard(path, root)
        done(path)

    def release_later(self, wd: Workdir, root: str) -> None:
        """Delete ``wd`` (and its scratch) in the background, and prepare the next work
        directories: once a compile is done — made while it runs, their fsyncs slow the
        compiler down (0.2-0.7 ms here)."""
        background().submit(self._release, wd.path, root)
        if wd.scratch != wd.path:
            background().submit(remove_quietly, wd.scratch)
        if self._spares is not None:
            self._spares.refill(CacheLayout(root).tmp)

    def close(self) -> None:
        if self._spares is not None:
            self._spares.discard_all()
