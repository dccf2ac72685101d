"""Fallback exec shim, used only when the C shim cannot be built: the same
command line and behaviour as shim.c (rlimits, Landlock, subreaper supervision),
in Python. Run as ``python -I -S _pyshim.py ...``: standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import struct
import sys

_LIMITS = {
    "-a": resource.RLIMIT_AS,
    "-c": resource.RLIMIT_CPU,
    "-f": resource.RLIMIT_FSIZE,
    "-n": resource.RLIMIT_NOFILE,
}
_FS_FILE = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
_READ_X = (1 << 0) | (1 << 2) | (1 << 3)


def _die(code: int, what: str) -> None:
    sys.stderr.write(f"safejit-shim: {what}\n")
    os._exit(code)


def landlock_restrict(ro: list[str], rw: list[str], deny_net: bool, required: bool) -> None:
    """Restrict this process: read-only ``ro``, read-write ``rw``, nothing else."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        if required:
            _die(125, "landlock unavailable")
        return
    handled = (1 << 13) - 1
    handled |= (1 << 13) if abi >= 2 else 0
    handled |= (1 << 14) if abi >= 3 else 0
    handled |= (1 << 15) if abi >= 5 else 0
    net = 3 if deny_net and abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    attr = struct.pack("QQQ", handled, net, scoped)
    size = 24 if scoped else (16 if net else 8)
    buf = ctypes.create_string_buffer(attr)
    rs = libc.syscall(444, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        _die(126, "landlock_create_ruleset")
    for paths, access in ((ro, _READ_X), (rw, handled)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            for allowed in (access & handled, access & handled & _FS_FILE):
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd))
                if libc.syscall(445, ctypes.c_int(rs), ctypes.c_int(1), rule, ctypes.c_uint32(0)) == 0:
                    break
            else:
                _die(126, path)
            os.close(fd)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        _die(126, "no_new_privs")
    if libc.syscall(446, ctypes.c_int(rs), ctypes.c_uint32(0)) != 0:
        _die(126, "landlock_restrict_self")


def _children() -> list[int]:
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    rest = fh.read().rsplit(b")", 1)[1].split()
                if int(rest[1]) == me:
                    out.append(int(name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def main(argv: list[str]) -> int:
    ro: list[str] = []
    rw: list[str] = []
    deny_net = required = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag = argv[i]
        if flag in ("-N", "-L"):
            deny_net, required = deny_net or flag == "-N", required or flag == "-L"
        elif flag in _LIMITS or flag in ("-r", "-w"):
            i += 1
            if flag == "-r":
                ro.append(argv[i])
            elif flag == "-w":
                rw.append(argv[i])
            else:
                resource.setrlimit(_LIMITS[flag], (int(argv[i]), int(argv[i])))
        else:
            _die(124, flag)
        i += 1
    prog = argv[i + 1 :]
    if not prog:
        _die(124, "no program")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if ro or rw or required:
            landlock_restrict(ro, rw, deny_net, required)
        try:
            os.execv(prog[0], prog)  # noqa: S606 - exec of the argv list is the shim's job
        finally:
            _die(127, prog[0])
    code = 127
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            if stopping:
                code = 137
                break
            continue
        except ChildProcessError:
            break
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            code = code if code >= 0 else 128 - code
            break
    # Kill all children, reap one, repeat: an orphan reparented to us meanwhile
    # is killed on the next round, never waited for.
    for _ in range(1_000_000):
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            if not _children():
                break
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
