"""Starting an exec shim (``shim.c``, or ``_pyshim.py``) and talking to it.

A shim is started before its run is known: stdin a socket to this process, stdout
and stderr a pipe (the run's output). It does what it can ahead — namespaces, the
scratch tmpfs — and reports what it got (:class:`Walls`), handing over the tmpfs's
descriptor; then it waits on the socket for the run's command (:meth:`Shim.submit`).
Its pidfd is opened right after it starts, while it cannot have been reaped: a wait
on it can never be a wait on another process that took its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ._scratch import Scratch

__all__ = ["REPORT_TIMEOUT_S", "Shim", "ShimStartError", "Walls", "drain", "launch"]

#: How long a shim may take to report what it prepared (a Python shim starts in ~20 ms).
REPORT_TIMEOUT_S: Final = 30.0
_REPORT_HEAD: Final = b"safejit-shim 2 "


class ShimStartError(OSError):
    """A shim could not be started, or died before its report (its output says why).
    ``verdict``: the shim itself exited saying a wall could not be put up (its codes 125
    and 126), not killed, late, never started or short of processes, memory or descriptors
    for a moment (its code 123): what ``auto`` may run with fewer walls for."""

    verdict = False


@dataclass(frozen=True, slots=True)
class Walls:
    """What a shim prepared ahead, as it reported it."""

    userns: bool = False
    mntns: bool = False
    scratch: bool = False
    seccomp: bool = False
    landlock: int = 0
    #: The uid the program runs as.
    uid: int = -1
    #: Whether a process limit applies (per run in a user namespace, or per uid).
    nproc: bool = False

    @classmethod
    def parse(cls, line: bytes) -> Walls:
        if not line.startswith(_REPORT_HEAD) or not line.endswith(b"\n"):
            raise ValueError(f"not a shim report: {line[:200]!r}")
        fields = dict(item.split("=", 1) for item in line[len(_REPORT_HEAD) :].decode("ascii").split())
        return cls(
            userns=fields["userns"] == "1",
            mntns=fields["mntns"] == "1",
            scratch=fields["scratch"] == "1",
            seccomp=fields["seccomp"] == "1",
            landlock=int(fields["landlock"]),
            uid=int(fields["uid"]),
            nproc=fields["nproc"] == "1",
        )


class Shim:
    """A started shim: its process, pidfd (-1 where there is none), the read end of its
    output, the socket its command goes to, its report and its scratch tmpfs."""

    def __init__(
        self, proc: subprocess.Popen[bytes], pidfd: int, output: int, sock: socket.socket, walls: Walls,
        scratch: Scratch | None,
    ) -> None:  # fmt: skip
        self.owner = os.getpid()
        self.proc = proc
        self.pidfd = pidfd
        self.output = output
        self.sock = sock
        self.walls = walls
        self.scratch = scratch

    def submit(self, command: Sequence[str]) -> None:
        """Hand over the run's command; raises ``OSError`` when the shim is gone."""
        body = b"".join(os.fsencode(a) + b"\0" for a in command)
        self.sock.sendall(len(body).to_bytes(4, "little") + body)
        # (the socket stays open the other way: the shim reports the run's end on it)
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Release this process's ends (the process itself is the runner's to reap)."""
        self.sock.close()
        if self.scratch is not None:
            self.scratch.close()
        for fd in (self.output, self.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.output = self.pidfd = -1

    def retire(self) -> None:
        """End a shim that never got a command: EOF on its socket makes it exit."""
        self.sock.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.close()


def launch(argv: Sequence[str], *, pass_fds: Sequence[int] = (), owner: tuple[int, int] | None = None) -> Shim:
    """Start a shim and wait for its report. ``owner``: the ids the program runs as,
    when they are not this process's (the caller is root): its output pipe is theirs,
    so that it may open it again by name (``/dev/stdout``, as a probe of the linker
    does). Raises :class:`ShimStartError`."""
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # (out of descriptors: as a failed start)
        raise ShimStartError(exc.errno, f"could not start the sandbox shim: {exc.strerror}") from exc
    try:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    except OSError as exc:
        ours.close()
        theirs.close()
        raise ShimStartError(exc.errno, f"could not start the sandbox shim: {exc.strerror}") from exc
    try:
        if owner is not None:
            os.fchown(write_fd, *owner)
        proc = subprocess.Popen(
            list(argv),
            cwd="/",
            env={},
            stdin=theirs.fileno(),
            stdout=write_fd,
            stderr=subprocess.STDOUT,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            process_group=0,
        )
    except OSError as exc:
        ours.close()
        os.close(read_fd)
        raise ShimStartError(exc.errno, f"could not start the sandbox shim: {exc.strerror}") from exc
    finally:
        theirs.close()
        os.close(write_fd)
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        walls, scratch = _read_report(ours)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # (one that exited: how; one still there is killed below)
        said = proc.returncode in _VERDICTS
        _abandon(proc, ours, pidfd)
        output = drain(read_fd)
        os.close(read_fd)
        error = ShimStartError(f"the sandbox shim did not start: {exc}; {output.strip()[-2000:]}")
        error.verdict = said
        raise error from None
    return Shim(proc, pidfd, read_fd, ours, walls, scratch)


#: The shim's exit codes for a wall it could not put up, or its setup failing (shim.c).
_VERDICTS: Final = frozenset({125, 126})


def _read_report(sock: socket.socket) -> tuple[Walls, Scratch | None]:
    sock.settimeout(REPORT_TIMEOUT_S)
    line, fds = b"", []
    while not line.endswith(b"\n") and len(line) < 1024:
        data, got, _, _ = socket.recv_fds(sock, 1024, 1)
        fds += got
        if not data:
            raise ValueError("it exited before reporting")
        line += data
    sock.settimeout(None)
    try:
        walls = Walls.parse(line)
        if len(fds) != int(walls.scratch):
            raise ValueError("its report and the descriptors it sent disagree")
    except (ValueError, KeyError):
        for fd in fds:
            os.close(fd)
        raise
    return walls, Scratch(fds[0]) if fds else None


def _abandon(proc: subprocess.Popen[bytes], sock: socket.socket, pidfd: int) -> None:
    sock.close()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if pidfd >= 0:
        os.close(pidfd)


def drain(fd: int) -> str:
    """What a shim's output pipe holds now (up to 64 KiB), without waiting for more."""
    os.set_blocking(fd, False)
    out = bytearray()
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while (chunk := os.read(fd, 1 << 16)) and len(out) < 1 << 16:
            out += chunk
    return out.decode("utf-8", "replace")
