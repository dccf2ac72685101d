"""Waiting for a sandboxed process (sandbox.runner): reading its output (the head
and tail kept), waking the moment it exits (a pidfd), its deadline, and the files
it closes while it runs (sandbox._closewatch)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from typing import Final

from ._closewatch import ClosedFiles

__all__ = ["LOG_HEAD", "LOG_TAIL", "OutputLog", "wait_for_exit"]

LOG_HEAD: Final = 48 * 1024
LOG_TAIL: Final = 16 * 1024


class OutputLog:
    """The head and tail of a process's output; the middle of a flood is counted, not kept."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, chunk: bytes) -> None:
        room = LOG_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > LOG_TAIL:
                self.cut += len(self.tail) - LOG_TAIL
                del self.tail[: len(self.tail) - LOG_TAIL]

    def drain(self, fd: int) -> None:
        """Read what is already in the pipe (a straggler may still hold its write end)."""
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while chunk := os.read(fd, 1 << 16):
                self.add(chunk)

    def text(self) -> str:
        cut = f"\n[... {self.cut} bytes cut ...]\n".encode() if self.cut else b""
        return bytes(self.head + cut + self.tail).decode("utf-8", "replace")


def wait_for_exit(
    proc: subprocess.Popen[bytes], timeout: float, read_fd: int, log: OutputLog, reader: ClosedFiles | None = None
) -> int:
    """Read the output until the process exits, waking the moment it does
    (``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which would dominate
    a fast compile), and let ``reader`` read the watched files it reports closed.
    Raises ``TimeoutExpired`` past ``timeout``. The time ``reader``'s callback takes
    (the caller's work on what was closed: staging the leaf, on a slow cache disk say)
    is not the compiler's: it moves the deadline, by no more than ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    credit = timeout

    def read_closed() -> None:
        nonlocal deadline, credit
        assert reader is not None
        busy = reader.busy
        reader()
        spent = min(reader.busy - busy, credit)
        deadline += spent
        credit -= spent

    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        poller = select.poll()
        poller.register(read_fd, select.POLLIN)
        if pidfd >= 0:
            poller.register(pidfd, select.POLLIN)
        if reader is not None:
            poller.register(reader.closes.fd, select.POLLIN)
        open_pipe = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if proc.poll() is None:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                # It ended in time; this loop was busy (reading what it closed).
                if reader is not None and reader.active:
                    reader()
                return proc.wait()
            # Without a pidfd (or once the pipe is closed), look at the process every 10 ms.
            wait_ms = int(left * 1000) + 1 if pidfd >= 0 and open_pipe else min(int(left * 1000) + 1, 10)
            events = dict(poller.poll(wait_ms))
            if read_fd in events:
                chunk = os.read(read_fd, 1 << 16)
                if chunk:
                    log.add(chunk)
                else:
                    poller.unregister(read_fd)
                    open_pipe = False
            # The process may have exited already: its closes were queued before its exit.
            if reader is not None and reader.active and (reader.closes.fd in events or pidfd in events):
                read_closed()
                if not reader.active:
                    poller.unregister(reader.closes.fd)
            if pidfd in events:
                return proc.wait()
            if pidfd < 0 and proc.poll() is not None:
                if reader is not None and reader.active:
                    reader()
                return proc.wait()
    finally:
        if pidfd >= 0:
            os.close(pidfd)
