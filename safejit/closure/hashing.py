"""File facts: regular-file opens that never block, BLAKE3 digests, stat snapshots.

A file's digest is taken with its stat *before* its bytes are read (stat-then-read):
a concurrent edit can only make the snapshot look older than the digest, which
forces a rehash later, never a stale pass. Nothing here follows a path twice
where once will do, blocks on a FIFO, or takes a terminal.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import Final

import blake3

__all__ = [
    "RACY_WINDOW_NS",
    "Snapshot",
    "digest_bytes",
    "hash_file",
    "hash_opened",
    "is_racy",
    "new_hasher",
    "open_beneath",
    "open_regular",
    "read_beneath",
    "read_file",
    "read_output",
    "snapshot_of",
]

#: A file whose mtime/ctime is this close to "now" may still change within the
#: same filesystem timestamp tick, so its stat cannot vouch for its content
#: (git's "racily clean" problem). Such files are rehashed, never stat-trusted.
RACY_WINDOW_NS: Final = 2_000_000_000

#: From this size BLAKE3 hashes on every core (its tree mode). Not lower: on a 2-core machine
#: a 1 MB hash took 112 us on threads in a tight loop but 245 us (against 170 on one) after
#: the threads had parked, as between two remote hits.
_PARALLEL_BYTES: Final = 1 << 20
Snapshot = tuple[int, int, int, int, int]  # dev, ino, size, mtime_ns, ctime_ns


def new_hasher() -> blake3.blake3:
    return blake3.blake3()


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """256-bit BLAKE3 of ``data``, as hex (on every core from 1 MiB: BLAKE3's tree mode)."""
    if len(data) >= _PARALLEL_BYTES:
        return blake3.blake3(data, max_threads=_threads()).hexdigest()
    return blake3.blake3(data).hexdigest()


def snapshot_of(st: os.stat_result) -> Snapshot:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_racy(snap: Snapshot, now_ns: int | None = None) -> bool:
    now = time.time_ns() if now_ns is None else now_ns
    return now - max(snap[3], snap[4]) < RACY_WINDOW_NS


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


def open_beneath(path: str, allowed: Callable[[str], bool]) -> tuple[int, os.stat_result, str] | None:
    """An fd for reading the regular file ``path`` (symlinks followed), its stat and its
    real path — if that real path is ``allowed``; None when it is not, before the file
    is opened for reading (a terminal, a FIFO's writer are never touched). The real path
    is that of the very file opened: found through an ``O_PATH`` descriptor, which is
    then opened again (a symlinked dir swapped meanwhile cannot make it another)."""
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
    return fd, st, real


def hash_opened(path: str, allowed: Callable[[str], bool]) -> tuple[str, Snapshot] | None:
    """:func:`hash_file` of the file :func:`open_beneath` opens; None when it is not allowed."""
    opened = open_beneath(path, allowed)
    if opened is None:
        return None
    fd, st, _ = opened
    try:
        return _hash_fd(fd, st), snapshot_of(st)
    finally:
        os.close(fd)


def read_beneath(path: str, allowed: Callable[[str], bool]) -> tuple[bytes, os.stat_result, str] | None:
    """The bytes, stat (taken before reading) and real path of the file :func:`open_beneath`
    opens; None when it is not allowed."""
    opened = open_beneath(path, allowed)
    if opened is None:
        return None
    fd, st, real = opened
    try:
        return _read_all(fd, st), st, real
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


def read_output(path: str, limit: int | None = None) -> bytes:
    """A file a sandboxed process wrote (artifact, depfile), read without trusting it:
    never through a symlink, never blocking on a FIFO. Anything but a regular file
    raises ``OSError``; one of more than ``limit`` bytes ``LimitExceededError``, before
    a byte of it is read."""
    fd, st = open_regular(path, nofollow=True)
    try:
        if limit is not None and st.st_size > limit:
            from ..errors import LimitExceededError

            name = os.path.basename(path)
            raise LimitExceededError(f"{name} is {st.st_size} bytes; the limit is {limit}", limit=limit)
        return _read_all(fd, st)
    finally:
        os.close(fd)
