"""Low-level file operations with fault points, fsyncs and no symlink following."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Callable
from typing import Any, Final

from .. import _forksafe, faults

__all__ = [
    "Flock",
    "fsync_dir",
    "fsync_file",
    "group_writable",
    "lock_file",
    "makedirs_durable",
    "mkdir_shared",
    "read_bytes",
    "readable_by_group",
    "remove_tree",
    "rename",
    "write_file",
]

_O_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def write_file(path: str, data: bytes, mode: int = 0o644, *, prepared: bool = False, sync: bool = True) -> bool:
    """Create ``path`` (must not exist), write ``data`` and fsync it (unless not ``sync``:
    then the caller fsyncs it, :func:`fsync_file`).

    With ``prepared``, an empty file made ahead at ``path`` (cache.staging) is filled
    instead — only if it is still exactly that: regular, empty, one link, ours.
    Returns whether it was (False: the file was created, so its directory changed).
    """
    faults.point("disk.write")
    data = faults.mangle("disk.write", data)
    fd = _open_blank(path) if prepared else -1
    filled = fd >= 0
    if not filled:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            faults.point("disk.fsync")
            os.fsync(fd)
        else:
            _start_writeback(fd)
    finally:
        os.close(fd)
    return filled


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()


def _start_writeback(fd: int) -> None:
    """Have the kernel start writing ``fd``'s dirty pages now (Linux; a hint, never waited
    on): a later fsync then finds them written, and several fsyncs share one commit."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE


def fsync_file(path: str) -> None:
    faults.point("disk.fsync")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_blank(path: str) -> int:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return -1
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_size == 0 and st.st_nlink == 1 and st.st_uid == os.geteuid():
        return fd
    os.close(fd)
    return -1


def fsync_dir(path: str) -> None:
    faults.point("disk.fsync")
    fd = os.open(path, _O_DIR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename(src: str, dst: str) -> None:
    faults.point("disk.rename")
    os.rename(src, dst)


def read_bytes(path: str, limit: int) -> bytes:
    """Read a regular file (not through a symlink, never blocking on a FIFO), at most
    ``limit`` bytes."""
    faults.point("disk.read")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        chunks = []
        remaining = st.st_size + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def shared_dir_mode(group: bool = False) -> int:
    """The mode a directory of the shared tree gets: ``0775`` less this process's umask, as
    ``mkdir`` gives (so a root shared by a group, setgid with umask 002, stays writable by
    the group; with the usual 022, 0755; never writable by others, even with umask 000);
    with ``group`` (the root is one a group shares: :func:`group_writable`), ``0775``
    whatever the umask. Leaves' files are 0644 whatever the umask."""
    global _umask
    if group:
        return 0o775
    if _umask is None:
        try:
            with open("/proc/self/status", "rb") as f:
                line = next(x for x in f if x.startswith(b"Umask:"))
            _umask = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError, IndexError):
            _umask = 0o022
    return 0o775 & ~_umask


_umask: int | None = None


def group_writable(root: str) -> bool:
    """Whether the cache root ``root`` is one a group shares, set up as docs/security.md
    says (setgid and group-writable; not sticky, not writable by all: a group's scratch
    directory, or ``/tmp``, is no shared cache). Whatever this process's umask: one
    member's 077 made the shared tree's dirs (``v1``, a shard, a build key's) 0700, which
    closed every key under them to the rest of the group for good."""
    try:
        mode = os.stat(root).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_ISGID and mode & stat.S_IWGRP and not mode & (stat.S_ISVTX | stat.S_IWOTH))


def readable_by_group(fd: int) -> None:
    """In a root a group shares: the file ``fd`` is open on (one this process made) 0644,
    whatever the umask took of that (077 made a leaf's files 0600: the group's hits could
    not read them)."""
    os.fchmod(fd, 0o644)  # (the umask read once may have changed since: not trusted)


def mkdir_shared(path: str, *, dir_fd: int | None = None, group: bool = False) -> None:
    """``mkdir`` of a directory of a cache's tree (``FileExistsError`` as ``mkdir``), made
    :func:`shared_dir_mode`; with ``group`` (the root is one a group shares:
    :func:`group_writable`), writable by the group whatever the umask takes of its write
    bit. One member's usual 022 left what it made first closed to the others: their
    publishes failed under it, their hits could not renew its leaves' age, their prunes
    could not remove them."""
    os.mkdir(path, 0o775, dir_fd=dir_fd)
    if not group:
        return  # (not shared: the umask alone)
    # (by descriptor: a name another member of the group swapped for a symlink is not followed)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o775 | (os.fstat(fd).st_mode & stat.S_ISGID))
    finally:
        os.close(fd)


def makedirs_durable(path: str, *, root: str | None = None) -> None:
    """``mkdir -p`` that fsyncs each parent whose entries it changed; what it makes below
    ``root`` (a cache root) :func:`mkdir_shared` as the root says, the rest (the root and
    its parents) by the umask alone."""
    missing = []
    cur = path
    while not os.path.isdir(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    inside = root.rstrip("/") + "/" if root is not None else None
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            # (the root's own state decides, once it is there: it may be made just now)
            mkdir_shared(d, group=inside is not None and d.startswith(inside) and group_writable(inside))
        fsync_dir(os.path.dirname(d))


def remove_tree(path: str, *, within: str) -> None:
    """Delete ``path`` recursively, only inside ``within`` — which must itself be what it
    says, not a symlink to elsewhere. Every directory on the way from ``within`` is
    opened without following a symlink, and the tree is removed through descriptors
    (``shutil.rmtree(dir_fd=)``): a directory swapped for a symlink at any moment is
    refused or removed as the link, never followed."""
    real_within = os.path.realpath(within)
    if real_within != os.path.normpath(os.path.abspath(within)):
        raise OSError(errno.EPERM, f"refusing to delete through a symlink: {within}", path)
    rel = os.path.relpath(os.path.abspath(path), real_within).split(os.sep)
    if rel[0] in (os.curdir, os.pardir) or os.pardir in rel:
        raise OSError(errno.EPERM, f"refusing to delete outside {within}", path)
    *parents, name = rel
    fd = os.open(real_within, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parents:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            rmtree_at(fd, name, onerror=_gone_is_fine)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def rmtree_at(fd: int, name: str, onerror: Any = None) -> None:
    """``shutil.rmtree(name, dir_fd=fd)`` (which never follows a symlink, and checks that what
    it opened is what it stat'ed), for a tree of any depth: Python 3.11's recurses, and a
    tree deeper than the recursion limit (a compiler's, or one planted in a shared cache)
    raised RecursionError; the rest of such a tree is removed one directory at a time."""
    try:
        shutil.rmtree(name, dir_fd=fd, onerror=onerror)
    except RecursionError:  # (3.11, 3.12: rmtree recurses)
        _rmtree_deep(fd, name)
    except OSError as exc:  # (3.13+: rmtree iterates, holding a descriptor per level)
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        _rmtree_deep(fd, name)


def _rmtree_deep(fd: int, name: str) -> None:
    """Remove the tree ``name`` of the directory ``fd`` holding one directory open at a
    time, going down by names (no symlink followed) and back up by ``..`` — checked to
    be the very directory it came down from (one renamed elsewhere meanwhile, by a writer
    of a shared root, would lead into another tree): else ``OSError``, nothing more removed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    path = [name]  # from fd down to cur
    cur = os.open(name, flags, dir_fd=fd)
    ids = [_dir_id(fd)]  # the directory above each of path's
    try:
        while True:
            down = None
            with os.scandir(cur) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        down = entry.name
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=cur)
            if down is not None:
                nxt = os.open(down, flags, dir_fd=cur)
                ids.append(_dir_id(cur))
                os.close(cur)
                cur = nxt
                path.append(down)
                continue
            empty, above = path.pop(), ids.pop()
            if not path:
                os.close(cur)
                cur = -1
                if _dir_id(fd) != above:  # pragma: no cover - fd is held open
                    raise OSError(errno.ESTALE, "the tree moved while it was removed", name)
                os.rmdir(empty, dir_fd=fd)
                return
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
            os.close(cur)
            cur = up
            if _dir_id(cur) != above:
                raise OSError(errno.ESTALE, "the tree moved while it was removed", name)
            os.rmdir(empty, dir_fd=cur)
    finally:
        if cur >= 0:
            os.close(cur)


def _dir_id(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _gone_is_fine(func: object, path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):  # (removed meanwhile by another)
        raise exc_info[1]


class Flock:
    """An exclusive ``flock`` held through one open file description; ``release`` ends it
    (so does the death of the process)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close_lock(fd)


#: The descriptors of lock files this process has open. A forked child shares their open
#: file descriptions, so the locks would stay held for as long as it lived (every later
#: build of the key, anywhere on the node, waited out its lock timeout): it closes its
#: copies at once.
_lock_fds: set[int] = set()


def _open_lock(path: str, group: bool = False) -> int:
    """A lock file, opened to be flocked: read-only (flock needs no more, and another
    user's lock file in a shared root is 0644), non-blocking (a FIFO planted there does
    not hang the open), no link followed, made if missing."""
    with _forksafe.descriptors:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
        _lock_fds.add(fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        _close_lock(fd)
        raise OSError(errno.ENXIO, "not a regular file", path)
    if group and st.st_uid == os.geteuid() and st.st_size == 0 and st.st_nlink <= 2 and st.st_mode & 0o044 != 0o044:
        # (in a root a group shares, made under a umask of 077: the others could not open it,
        # took it for no lock file, set it aside and compiled the key beside its holder. An
        # empty file of this user's own, linked at most once more: its blank, not a file of
        # this user's that a member of the group linked there)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)
    return fd


def _close_lock(fd: int) -> None:
    with _forksafe.descriptors:
        if fd in _lock_fds:  # (not in a forked child, which closed its copies already)
            _lock_fds.discard(fd)
            os.close(fd)


def _close_locks_in_child() -> None:
    for fd in list(_lock_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def lock_file(path: str, timeout: float, *, blank: str | None = None, group: bool = False) -> Flock | None:
    """Lock ``path`` exclusively, waiting up to ``timeout`` seconds; None on timeout.

    A missing lock file is created — by hard-linking ``blank`` (an empty file made
    ahead, cache.staging) there when one is given, which allocates no inode. A lock
    taken on a file that ``gc`` has meanwhile unlinked (or replaced) is let go and taken
    again on the file the path names now: two holders of one key never coexist.
    """
    if blank is not None:
        with contextlib.suppress(OSError):  # EEXIST: it is there already; else create it below
            os.link(blank, path, follow_symlinks=False)
    fd = _open_lock(path, group)
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held, named = os.fstat(fd), _ident(path)
            if (held.st_dev, held.st_ino) == named:
                return Flock(fd)
            _close_lock(fd)  # removed by gc since it was opened: take the one there now
            fd = -1  # (its number may be another thread's by now: never closed again)
            fd = _open_lock(path, group)
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                _close_lock(fd)
                return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        except BaseException:
            if fd >= 0:
                _close_lock(fd)
            raise


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)
