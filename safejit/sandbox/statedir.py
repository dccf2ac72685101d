"""This user's private state: the exec shim, the stat memo, the toolchain probes.

A shared cache directory is data, never code or trusted state: whoever can write it
could otherwise swap what this process executes or believes. So executables and
state live in a per-user directory outside every cache root — ``$XDG_STATE_HOME/
safejit``, else ``~/.local/state/safejit``, else ``$XDG_RUNTIME_DIR/safejit`` (or
``/run/user/<uid>/safejit``), else a private temporary directory removed at exit —
used only if

- every directory on its way is owned by this user or root and writable by no one
  else (unless sticky, as ``/tmp`` is: there no one else can move our entries);
- it is a real directory (no symlink), owned by this user, writable by no one else.

It is walked to and opened once (``O_PATH``, never following a symlink) and then
reached through that descriptor (:attr:`StateDir.path` is ``/proc/self/fd/<n>``):
a directory swapped on the way afterwards changes nothing. Files read from it are
checked again (:func:`open_private_file`): a file that is not ours or that others
may write is never used.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import Sequence

from .. import _env, _forksafe
from ..closure.anchors import is_under, real_path

__all__ = ["StateDir", "open_private_file", "private_file", "state_dir"]

logger = logging.getLogger(__name__)

_NOT_OURS = "not owned by this user, or writable by others"


def private_file(st: os.stat_result) -> bool:
    """Whether ``st`` is a regular file of ours that no one else may write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def open_private_file(path: str, flags: int = os.O_RDONLY, *, dir_fd: int | None = None) -> int:
    """Open a file of the state dir (never through a symlink, never blocking): raises
    ``PermissionError`` when it is not a regular file of ours that only we may write."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not private_file(os.fstat(fd)):
            raise PermissionError(f"{path}: {_NOT_OURS}")
    except BaseException:
        os.close(fd)
        raise
    return fd


class StateDir:
    """The private state directory, held open. ``path`` reaches it through the
    descriptor; ``shown`` is where it is, for messages."""

    def __init__(self, fd: int, shown: str, *, temporary: bool = False) -> None:
        self.fd = fd
        self.shown = shown
        self.temporary = temporary
        through = f"/proc/self/fd/{fd}"
        #: Where its files are reached: through the descriptor (``shown`` where /proc is missing).
        self.path = through if os.path.isdir(through) else shown
        self._finalizer = weakref.finalize(self, _close_fd, fd, os.getpid())

    def close(self) -> None:
        self._finalizer()


def _close_fd(fd: int, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.close(fd)


def _secure_ancestor(st: os.stat_result) -> bool:
    """A directory on the way: ours or root's, and only writable by others when sticky."""
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        return False
    return not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX)


#: What a call said while it held ``_lock``: (level, message, args), logged once it let go
#: (a handler that reacts by starting a Runtime would otherwise wait on the lock for good).
_Notes = list[tuple[int, str, tuple[object, ...]]]


def _open_private(path: str, *, create: bool, notes: _Notes) -> int | None:
    """Walk to ``path`` from ``/``, one component at a time without following a symlink,
    every directory on the way checked; create what is missing (0700) with ``create``.
    The descriptor (``O_PATH``) of the final directory, or None."""
    # (links on the way lead somewhere; where they lead is walked and checked. The
    # directory itself must be no link.)
    head, name = os.path.split(os.path.abspath(path))
    parts = [p for p in real_path(head).split("/") if p] + [name]
    if not parts:
        return None
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            if not _secure_ancestor(os.fstat(fd)):
                return None
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if i == len(parts) - 1:
                st = os.fstat(fd)
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    notes.append((logging.WARNING, "%s is %s: not using it for private state", (path, _NOT_OURS)))
                    return None
        found, fd = fd, -1
        return found
    except OSError as exc:
        notes.append((logging.DEBUG, "no private state in %s: %s", (path, exc)))
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _remove(path: str, owner: int) -> None:
    """Remove the temporary state dir ``path`` at exit, in the process that made it only: a
    child forked from it runs its exit hooks too, and removed it from under its parent (whose
    later compiles went uncached, with no recorder or C shim to be had)."""
    if os.getpid() == owner:
        shutil.rmtree(path, True)


def _inside(path: str, roots: Sequence[str]) -> bool:
    real = real_path(path)
    return any(is_under(real, real_path(root)) for root in roots)


_lock = _forksafe.Lock()
#: (pid, the directory's path; "" for a temporary one) -> the directory, held open: one
#: per place and process, however many Runtimes (and sets of cache roots) use it.
_opened: dict[tuple[int, str], StateDir] = {}


def state_dir(avoid: Sequence[str] = ()) -> StateDir:
    """This user's private state directory, outside every path in ``avoid`` (the cache
    roots): the first candidate that passes, else a private temporary one (one per
    process)."""
    notes: _Notes = []
    try:
        with _lock:
            return _find(avoid, notes)
    finally:
        for level, message, args in notes:
            logger.log(level, message, *args)


def _find(avoid: Sequence[str], notes: _Notes) -> StateDir:
    pid = os.getpid()
    for candidate in _env.state_dir_candidates():
        if _inside(candidate, avoid):
            notes.append((logging.WARNING, "%s lies in a cache root: not using it for private state", (candidate,)))
            continue
        found = _opened.get((pid, candidate))
        if found is None:
            fd = _open_private(candidate, create=True, notes=notes)
            if fd is None:
                continue
            found = _opened[(pid, candidate)] = StateDir(fd, candidate)
        return found
    found = _opened.get((pid, ""))
    if found is None:
        found = _opened[(pid, "")] = _temporary(notes)
    return found


def _temporary(notes: _Notes) -> StateDir:
    made = tempfile.mkdtemp(prefix="safejit-state-")
    atexit.register(_remove, made, os.getpid())
    notes.append((logging.WARNING, "no private state directory to keep; using %s for this process", (made,)))
    fd = _open_private(made, create=False, notes=notes)
    if fd is None:  # pragma: no cover - mkdtemp makes a private directory
        raise PermissionError(f"{made}: {_NOT_OURS}")
    return StateDir(fd, made, temporary=True)
