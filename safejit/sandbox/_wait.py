"""Waiting for a sandboxed process (sandbox.runner): reading its output (the head
and tail kept), waking the moment it exits (a pidfd), its deadline, and the files
it closes while it runs (sandbox._closewatch)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from typing import Final

from ._closewatch import ClosedFiles

__all__ = ["LOG_HEAD", "LOG_TAIL", "OutputLog", "exited", "readable", "wait_for_exit"]

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
    proc: subprocess.Popen[bytes],
    timeout: float,
    read_fd: int,
    log: OutputLog,
    reader: ClosedFiles | None = None,
    *,
    pidfd: int = -1,
    status: socket.socket | None = None,
) -> tuple[int, bool]:
    """Read the output until the run is over, waking the moment it is (``Popen.wait(timeout)``
    polls with sleeps of up to 50 ms, which would dominate a fast compile), and let
    ``reader`` read the watched files it reports closed. Returns the exit status and
    whether the shim reported it on ``status`` (then everything it started has been
    reaped, and only the shim's own exit is left: the caller need not wait for it).
    Raises ``TimeoutExpired`` past ``timeout``. The time ``reader``'s callback takes
    (the caller's work on what was closed: staging the leaf, on a slow cache disk say)
    is not the compiler's: it moves the deadline, by no more than ``timeout`` in all.

    Never outlives the process: ``pidfd`` (opened when the process was started, so it
    cannot name another process that took its pid) wakes the wait when it exits; and
    each round also asks whether it has exited (or been reaped by someone else),
    without reaping it and without Popen's lock, where there is no pidfd."""
    # (Long: one poll loop over four sources (the output, the shim's status socket, the
    # close watcher, the pidfd) that share one deadline, one poller and the status bytes
    # read so far; which one ends the wait depends on the order they are looked at in.)
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

    def finish() -> tuple[int, bool]:
        if reader is not None and reader.active:
            reader()  # (its closes were queued before its exit)
        return _returncode(proc), False

    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    if reader is not None:
        poller.register(reader.closes.fd, select.POLLIN)
    said = bytearray()
    if status is not None:
        poller.register(status.fileno(), select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            if not exited(proc, pidfd):
                raise subprocess.TimeoutExpired(proc.args, timeout)
            return finish()  # it ended in time; this loop was busy (reading what it closed)
        # Without a pidfd, look at the process every 10 ms.
        wait_ms = int(left * 1000) + 1 if pidfd >= 0 else min(int(left * 1000) + 1, 10)
        events = dict(poller.poll(wait_ms))
        if read_fd in events:
            chunk = os.read(read_fd, 1 << 16)
            if chunk:
                log.add(chunk)
            else:
                poller.unregister(read_fd)
        if status is not None and status.fileno() in events:
            got = _recv(status)
            said += got
            if said.endswith(b"\n") or not got:
                poller.unregister(status.fileno())
                reported = _exit_status(bytes(said))
                if reported is not None:
                    if reader is not None and reader.active:
                        reader()  # (the closes were queued before the report)
                    return reported, True
                status = None  # gone without a word (killed): its exit tells
        # The process may have exited already: its closes were queued before its exit.
        if reader is not None and reader.active and (reader.closes.fd in events or pidfd in events):
            read_closed()
            if not reader.active:
                poller.unregister(reader.closes.fd)
        if (pidfd >= 0 and pidfd in events) or proc.returncode is not None or (pidfd < 0 and exited(proc)):
            return finish()


def exited(proc: subprocess.Popen[bytes], pidfd: int = -1) -> bool:
    """Whether ``proc`` has exited (a zombie, or reaped: by Popen or by anyone else)."""
    if proc.returncode is not None:
        return True
    if pidfd >= 0:
        return readable(pidfd, 0.0)
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped by someone else: its status is lost
    except OSError:
        return False


def readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` is readable within ``timeout_s`` (poll: ``select`` refuses a
    descriptor past 1023, which a process with many files open hands out)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000))


def _returncode(proc: subprocess.Popen[bytes]) -> int:
    """The status of a process that has exited. One whose status someone else took is
    reported as killed (-SIGKILL), never as a success."""
    if proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, 0)
        except ChildProcessError:
            pid, status = 0, 0
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
        elif proc.returncode is None:  # (not set by Popen meanwhile either)
            proc.returncode = -signal.SIGKILL
    return proc.returncode


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except OSError:
        return b""


def _exit_status(said: bytes) -> int | None:
    """The shim's report ``exit <code>``; None for anything else."""
    text = said.decode("ascii", "replace").strip()
    head, _, code = text.partition(" ")
    return int(code) if head == "exit" and code.isdigit() and len(code) <= 3 else None
