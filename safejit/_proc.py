"""Process liveness, for sweeping what ended processes left behind in shared places
(the cache's scratch dirs in memory).

A process id says nothing across PID namespaces (containers sharing ``/dev/shm``: a
process of another namespace looks dead, and a sweep removed the directories it was
using). So a process marks what it makes with an owner token of its own,
``p<pid>.<random>``, and holds a lock on ``<token>.alive`` beside it for as long as it
lives (:func:`owner`): a token whose mark nobody holds belongs to a process that ended
(:func:`ended`), whatever namespace it ran in. A forked child takes a token of its own.

A mark is found only where its owner keeps it (the user's private state dir): a
sweep run by another user, HOME or host cannot see it. So a directory in use is also
locked itself (:func:`use`, a shared ``flock`` on it until :func:`done`), and a sweep
removes one only while it holds it exclusively (:func:`claimed`): whoever runs it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator

from . import _forksafe

__all__ = ["claimed", "done", "ended", "owner", "sweep", "use"]

_MARK = ".alive"
_lock = _forksafe.Lock()
#: base -> (pid, token, the mark's descriptor)
_marks: dict[str, tuple[int, str, int]] = {}


def owner(base: str, prefix: str = "") -> str:
    """This process's owner token for what it makes in ``base`` (``prefix`` + token);
    its mark, ``base/<prefix><token>.alive``, made and locked the first time."""
    with _lock:
        found = _marks.get(base)
        pid = os.getpid()
        if found is not None and found[0] == pid:
            return found[1]
        token = f"{prefix}p{pid}.{os.urandom(6).hex()}"  # (a "-" ends it in the names it is given)
        mark = os.path.join(base, token + _MARK)
        # Made and locked under another name, then renamed into place: a sweep in another
        # process never sees the mark unlocked (it would take its owner for ended, and
        # remove the mark and what the owner was about to make).
        making = os.path.join(base, f".{token}.making")
        with _forksafe.descriptors:  # (registered at once: a child forked meanwhile closes it)
            fd = os.open(making, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            _marks[base] = (pid, token, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # (held until this process ends: its descriptor stays open)
            os.rename(making, mark)
        except BaseException:
            with _forksafe.descriptors:
                del _marks[base]
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(making)
            raise
        atexit.register(_unmark, mark, pid)
        return token


def _unmark(mark: str, pid: int) -> None:
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            os.unlink(mark)


def ended(base: str, token: str) -> bool:
    """Whether the process that owns ``token`` in ``base`` has ended: its mark is ours
    and nobody holds it. A token without a mark (made before marks, or not ours) is
    never taken for ended."""
    try:
        fd = os.open(os.path.join(base, token + _MARK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def unmade(base: str, name: str, min_age_s: float = 60.0) -> bool:
    """Whether ``name`` in ``base`` is a ``.<token>.making`` mark its process left when
    killed before it renamed it (:func:`owner`): ours, older than ``min_age_s``, and held
    by nobody (the maker holds its lock from the moment it made it)."""
    if not (name.startswith(".") and name.endswith(".making")):
        return False
    try:
        fd = os.open(os.path.join(base, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < min_age_s:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep(base: str, prefix: str, remove: Callable[[str], None]) -> None:
    """Remove (``remove``, given each path) every entry of ``base`` named
    ``<prefix>p<pid>.<random>-...`` whose owner has ended, then the owner's mark."""
    with contextlib.suppress(OSError):
        names = os.listdir(base)
        marks = {n[: -len(_MARK)] for n in names if n.startswith(prefix) and n.endswith(_MARK)}
        gone = {token for token in marks if ended(base, token)}
        if not gone:
            return
        for name in names:
            mine = name.startswith(prefix) and not name.endswith(_MARK)
            if mine and prefix + name[len(prefix) :].partition("-")[0] in gone:
                remove(os.path.join(base, name))
        for token in gone:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(base, token + _MARK))


# -- directories in use -----------------------------------------------------------------
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: path -> (pid, the descriptor whose shared lock says the directory is in use)
_used: dict[str, tuple[int, int]] = {}


def use(path: str) -> bool:
    """Lock the directory ``path`` as in use by this process, until :func:`done`. False
    when it is gone, or being removed (a sweep holds it): it must not be used. Where
    directories cannot be locked (some network file systems), it is used unlocked."""
    with _forksafe.descriptors:  # (registered at once: a child forked meanwhile closes it)
        try:
            fd = os.open(path, _O_DIR)
        except OSError:
            return False
        _used[path] = (os.getpid(), fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        done(path)
        return False
    except OSError:
        pass  # (no lock to take here: its age decides, as before locks)
    try:
        now, held = os.lstat(path), os.fstat(fd)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        done(path)  # removed or replaced before the lock was ours
        return False
    return True


def done(path: str) -> None:
    """``path`` is no longer in use by this process (removed, or about to be)."""
    with _forksafe.descriptors:
        found = _used.pop(path, None)
        if found is not None and found[0] == os.getpid():
            os.close(found[1])


@contextlib.contextmanager
def claimed(dir_fd: int, name: str) -> Iterator[bool]:
    """Whether the entry ``name`` of the directory ``dir_fd`` may be removed by a sweep:
    False while a process uses it (:func:`use`); else True, and nobody can start using
    it until the ``with`` block ends. An entry that is no directory, or cannot be
    opened or locked, is nobody's to ask: True."""
    try:
        fd = os.open(name, _O_DIR | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        yield True
        return
    busy = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        busy = True
    except OSError:
        pass
    try:
        yield not busy
    finally:
        os.close(fd)


def _forget_used_in_child() -> None:
    """A forked child uses none of its parent's directories and holds none of its marks
    (it takes a token of its own): their descriptors closed, so that the parent's end
    is seen when it ends (the parent's locks stay held by the parent's own)."""
    for _, fd in _used.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _used.clear()
    for _, _, fd in _marks.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _marks.clear()


os.register_at_fork(after_in_child=_forget_used_in_child)
