"""Noticing, while a compiler still runs, that it has closed a file it wrote.

A compiler writes its depfile when preprocessing and compiling are done; the
assembler and linker (gcc), or ptxas and fatbinary (nvcc), run for a further
20 ms to seconds; the linker's output is closed a millisecond or two before the
driver has cleaned up and exited. Whoever reads those files at their close
overlaps that work with the rest of the run. Linux inotify (``IN_CLOSE_WRITE``,
``IN_MOVED_TO``) reports the closes; where it is not available, nothing is
reported and the files are read after the compile.

A file may be written again before the compiler exits: its next close is
reported too, and only what was read at the last close reported before the
process was reaped stands for the file (the sandbox drains the watch then).
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from .. import _forksafe
from ..closure.hashing import read_output
from ..errors import LimitExceededError

__all__ = ["CloseWatch", "ClosedFiles"]

_IN_CLOSE_WRITE: Final = 0x8
_IN_MOVED_FROM: Final = 0x40
_IN_MOVED_TO: Final = 0x80  # (a file renamed onto a watched name is new content too)
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_WRITTEN: Final = _IN_CLOSE_WRITE | _IN_MOVED_TO
_REPLACED: Final = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM
_IN_Q_OVERFLOW: Final = 0x4000
#: How many times a watched file's close is acted on, at most.
_WATCH_CALLS: Final = 3
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
_IDLE_LOCK = _forksafe.Lock()


def _forget_idle() -> None:
    # A child shares its parent's instances: closing its copies is cheap and keeps
    # the two from reading each other's events.
    for fd in _IDLE:
        os.close(fd)
    _IDLE.clear()


os.register_at_fork(after_in_child=_forget_idle)


class CloseWatch:
    """Watch files of one directory for their close after writing; ``fd`` is for ``poll``."""

    __slots__ = ("fd", "head", "limit", "names", "view", "wd")

    def __init__(self, fd: int, wd: int, head: str, names: frozenset[bytes], view: str) -> None:
        self.fd = fd
        self.wd = wd
        self.head = head
        self.names = names
        self.view = view
        #: The largest file read at its close (None: any); one larger is read after the
        #: run, within the limit the caller sets for it, if at all.
        self.limit: int | None = None

    @classmethod
    def open(cls, paths: Sequence[str], *, view: str | None = None, limit: int | None = None) -> CloseWatch | None:
        """A watch for the close after writing of ``paths`` (all in one directory), or
        ``None`` where inotify is not to be had. ``view``: where this process reaches
        that directory as the writer sees it (its scratch tmpfs), if not by its path.
        ``limit``: the largest file read at its close."""
        heads = {os.path.dirname(p) for p in paths}
        if _LIBC is None or len(heads) != 1:
            return None
        with _IDLE_LOCK:
            fd = _IDLE.pop() if _IDLE else -1
        if fd < 0:
            fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
        (head,) = heads
        seen = view if view is not None else head or "."
        wd = _LIBC.inotify_add_watch(fd, os.fsencode(seen), _WRITTEN | _REPLACED)
        if wd < 0:
            _put_idle(fd)
            return None
        watch = cls(fd, wd, head, frozenset(os.fsencode(os.path.basename(p)) for p in paths), seen)
        watch.limit = limit
        return watch

    def reach(self, path: str) -> str:
        """Where this process reads the watched file ``path``."""
        return os.path.join(self.view, os.path.basename(path))

    def closed(self) -> list[tuple[str, bool]]:
        """What happened to the watched files since the last call, in order: (path, True)
        when one was closed after writing or renamed into place (read it now), (path,
        False) when one was created, deleted or renamed away (what was read no longer
        stands). Raises ``OSError`` when the watch cannot be read or events were lost."""
        seen: list[tuple[str, bool]] = []
        for wd, mask, name in _events(self.fd):
            if mask & _IN_Q_OVERFLOW:
                raise OSError("inotify queue overflow: events were lost")
            if wd == self.wd and name in self.names and mask & (_WRITTEN | _REPLACED):
                seen.append((os.path.join(self.head, os.fsdecode(name)), bool(mask & _WRITTEN)))
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


class ClosedFiles:
    """``files``: the watched files as read at their last close, kept up to date by
    calling this whenever ``closes.fd`` polls readable (and once the process has
    exited); ``on_closed(path, data)`` is told of each read. Gives up — ``files``
    emptied, ``active`` false — on a file closed over and over, and on all of them
    when the watch fails."""

    def __init__(
        self, closes: CloseWatch, files: dict[str, bytes], on_closed: Callable[[str, bytes], None] | None
    ) -> None:
        self.closes = closes
        self.files = files
        self.on_closed = on_closed
        self.reads: dict[str, int] = {}
        self.active = True
        #: Seconds spent in ``on_closed``: the caller's own work (at most
        #: ``_WATCH_CALLS`` calls for each watched file).
        self.busy = 0.0

    def __call__(self) -> None:
        try:
            closed = self.closes.closed()
        except OSError:
            self.stop()
            return
        for path, written in closed:
            if not written:
                self.files.pop(path, None)  # (its next close, if any, is read again)
                continue
            self.reads[path] = self.reads.get(path, 0) + 1
            if self.reads[path] > _WATCH_CALLS:  # not worth following
                self.stop()
                return
            try:
                data = read_output(self.closes.reach(path), self.closes.limit)
            except (OSError, LimitExceededError):  # (a file that large: read after, if at all)
                self.files.pop(path, None)
                continue
            self.files[path] = data
            if self.on_closed is not None:
                began = time.monotonic()
                try:
                    self.on_closed(path, data)
                finally:
                    self.busy += time.monotonic() - began

    def stop(self) -> None:
        self.active = False
        self.files.clear()


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
