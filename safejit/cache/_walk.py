"""Walking a cache root that others write: its layout as it really is, and its
directories reached by descriptor, entries never followed (``maintenance``, and the
usage records read back in ``usage``)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Final

from .fsio import rmtree_at
from .layout import CacheLayout, entries

__all__ = ["closing", "dirs", "each_in", "kind_of", "read_at", "real_layout", "remove_at", "sorted_entries"]

#: Open a file to read, never through a symlink, never blocking on a FIFO or taking a tty.
_O_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def real_layout(root: str) -> CacheLayout:
    """The layout of ``root`` as it really is (a root given through a symlink is fine;
    a ``v1`` that is a symlink is not walked: see ``maintenance.damaged``)."""
    return CacheLayout(os.path.realpath(os.path.expanduser(root)))


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def each_in(layout: CacheLayout, name: str) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """``(descriptor of <root>/v1/<name>, entry)`` for each entry; none when it is
    absent or not a real directory."""
    try:
        fd = layout.open_dirs((name,))
    except OSError:
        return
    with closing(fd):
        for entry in entries(fd):
            yield fd, entry


def remove_at(fd: int, name: str) -> None:
    """Delete the entry ``name`` of the directory ``fd``: a directory with everything in
    it (``shutil.rmtree`` by descriptors, which never follows a symlink), else the entry."""
    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
        rmtree_at(fd, name)
    else:
        os.unlink(name, dir_fd=fd)


def read_at(fd: int, name: str, limit: int) -> bytes:
    """A regular file of the directory ``fd``, at most ``limit`` bytes (a symlink, a
    FIFO, a device or a larger file is an ``OSError``)."""
    with closing(os.open(name, _O_READ, dir_fd=fd)) as f:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(f, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        return data


def kind_of(entry: os.DirEntry[str]) -> str:
    """What an entry is, in words, for a finding ("a symlink", "a FIFO"...)."""
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return "unreadable"
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a file" if stat.S_ISREG(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "?"


def sorted_entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def dirs(path: str, *, skip: frozenset[str] = frozenset()) -> list[os.DirEntry[str]]:
    return [e for e in sorted_entries(path) if e.name not in skip and e.is_dir(follow_symlinks=False)]
