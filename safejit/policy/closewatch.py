"""Noticing, while a compiler still runs, that it has closed a file it wrote.

A compiler writes its depfile when preprocessing and compiling are done; the
assembler and linker (gcc), or ptxas and fatbinary (nvcc), run for a further
20 ms to seconds. Whoever reads that depfile early can overlap work with the
rest of the run. Linux inotify (``IN_CLOSE_WRITE``) reports the close; where it
is not available, nothing is reported and that work runs after the compile.

What a watch reports is only a hint: the file may be written again before the
compiler exits, so work done on an early read must be checked against the
final file.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections.abc import Iterator
from typing import Final

__all__ = ["CloseWatch"]

_IN_CLOSE_WRITE: Final = 0x8
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC: Final = _libc()

#: Idle inotify instances of this process. Closing one waits for the kernel's
#: grace period (5-15 ms here), so they are kept and reused, one per concurrent run.
_IDLE: list[int] = []
_IDLE_MAX: Final = 16
_IDLE_LOCK = threading.Lock()


def _forget_idle() -> None:
    # A child shares its parent's instances: closing its copies is cheap and keeps
    # the two from reading each other's events.
    for fd in _IDLE:
        os.close(fd)
    _IDLE.clear()


os.register_at_fork(after_in_child=_forget_idle)


class CloseWatch:
    """Watch one file for its close after writing; ``fd`` is for ``poll``."""

    __slots__ = ("fd", "name", "wd")

    def __init__(self, fd: int, wd: int, name: bytes) -> None:
        self.fd = fd
        self.wd = wd
        self.name = name

    @classmethod
    def open(cls, path: str) -> CloseWatch | None:
        """A watch for ``path``'s close after writing, or ``None`` where inotify is not to be had."""
        if _LIBC is None:
            return None
        with _IDLE_LOCK:
            fd = _IDLE.pop() if _IDLE else -1
        if fd < 0:
            fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
        head, tail = os.path.split(os.fsencode(path))
        wd = _LIBC.inotify_add_watch(fd, head or b".", _IN_CLOSE_WRITE)
        if wd < 0:
            _put_idle(fd)
            return None
        return cls(fd, wd, tail)

    def closed(self) -> bool:
        """Whether the watched file was closed after writing since the last call.
        Raises ``OSError`` when the watch cannot be read."""
        seen = False
        for wd, mask, name in _events(self.fd):
            seen |= wd == self.wd and bool(mask & _IN_CLOSE_WRITE) and name == self.name
        return seen

    def close(self) -> None:
        """End the watch; the instance is kept for the next one."""
        _LIBC.inotify_rm_watch(self.fd, self.wd)  # type: ignore[union-attr]  # (fails once the dir is gone)
        try:
            for _ in _events(self.fd):  # what is left is this watch's: no later one sees it
                pass
        except OSError:
            os.close(self.fd)
            return
        _put_idle(self.fd)


def _events(fd: int) -> Iterator[tuple[int, int, bytes]]:
    """(watch, mask, name) of every event queued now."""
    while True:
        try:
            buf = os.read(fd, 4096)
        except BlockingIOError:
            return
        at = 0
        while at + _EVENT.size <= len(buf):
            wd, mask, _, size = _EVENT.unpack_from(buf, at)
            yield wd, mask, buf[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
            at += _EVENT.size + size


def _put_idle(fd: int) -> None:
    with _IDLE_LOCK:
        if len(_IDLE) < _IDLE_MAX:
            _IDLE.append(fd)
            return
    os.close(fd)
