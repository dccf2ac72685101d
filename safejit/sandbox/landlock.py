"""Landlock: the only home of its syscall numbers and access masks in the package.

Used by the sandbox runner (which passes roots to the exec shim, ``shim.c``) and by
in-process restriction (the NVRTC worker restricts itself). ``_pyshim.py`` runs as a
standalone script and keeps its own copy of these numbers; ``shim.c`` has its own
``#define``s. A test pins both copies to this module.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence
from typing import Final

__all__ = [
    "FS_ALL_V1",
    "FS_EXECUTE",
    "FS_FILE_RIGHTS",
    "FS_IOCTL_DEV",
    "FS_READ_DIR",
    "FS_READ_FILE",
    "FS_REFER",
    "FS_TRUNCATE",
    "FS_WRITE_FILE",
    "NET_BIND_TCP",
    "NET_CONNECT_TCP",
    "READ_EXECUTE",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
    "SYS_ADD_RULE",
    "SYS_CREATE_RULESET",
    "SYS_RESTRICT_SELF",
    "LandlockError",
    "abi",
    "handled_access",
    "restrict",
]

SYS_CREATE_RULESET: Final = 444
SYS_ADD_RULE: Final = 445
SYS_RESTRICT_SELF: Final = 446
CREATE_RULESET_VERSION: Final = 1 << 0
RULE_PATH_BENEATH: Final = 1

FS_EXECUTE: Final = 1 << 0
FS_WRITE_FILE: Final = 1 << 1
FS_READ_FILE: Final = 1 << 2
FS_READ_DIR: Final = 1 << 3
FS_ALL_V1: Final = (1 << 13) - 1
FS_REFER: Final = 1 << 13
FS_TRUNCATE: Final = 1 << 14
FS_IOCTL_DEV: Final = 1 << 15
#: The rights a rule on a regular file (not a directory) may hold.
FS_FILE_RIGHTS: Final = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_EXECUTE: Final = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
NET_BIND_TCP: Final = 1 << 0
NET_CONNECT_TCP: Final = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0
SCOPE_SIGNAL: Final = 1 << 1
_PR_SET_NO_NEW_PRIVS: Final = 38


class LandlockError(OSError):
    """A ruleset could not be built or applied."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The Landlock ABI version this kernel offers, 0 when none."""
    try:
        found = int(
            _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
        )
    except (OSError, AttributeError):
        return 0
    return max(found, 0)


def handled_access(version: int) -> int:
    """The filesystem rights a ruleset of ABI ``version`` handles (denies unless granted)."""
    handled = FS_ALL_V1
    handled |= FS_REFER if version >= 2 else 0
    handled |= FS_TRUNCATE if version >= 3 else 0
    handled |= FS_IOCTL_DEV if version >= 5 else 0
    return handled


def restrict(read: Sequence[str], write: Sequence[str], *, deny_net: bool, required: bool) -> bool:
    """Restrict this process for good: read (and execute) under ``read``, anything under
    ``write``, nothing else; no TCP with ``deny_net`` (ABI >= 4); no signals to, or
    abstract sockets of, processes outside (ABI >= 6). Returns whether Landlock was
    applied; raises :class:`LandlockError` when it must be (``required``) and cannot.
    Landlock binds the calling thread only: a process running other threads is refused
    when ``required`` (they would read unconfined); best effort restricts this thread."""
    libc = _libc()
    version = abi()
    if version < 1:
        if required:
            raise LandlockError("Landlock is unavailable")
        return False
    if required and _threads() > 1:
        # landlock_restrict_self restricts the calling thread only: the process's other
        # threads (a library's pool, started before) would go on reading unconfined.
        raise LandlockError("this process runs other threads, which Landlock would leave unconfined")
    handled = handled_access(version)
    net = NET_BIND_TCP | NET_CONNECT_TCP if deny_net and version >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
    size = 24 if scoped else (16 if net else 8)
    attr = ctypes.create_string_buffer(struct.pack("QQQ", handled, net, scoped))
    ruleset = int(libc.syscall(SYS_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for paths, access in ((read, READ_EXECUTE), (write, handled)):
            for path in paths:
                _add_path(libc, ruleset, path, access & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "no_new_privs")
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return True


def _threads() -> int:
    """This process's threads (0: unknown, without /proc)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _add_path(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # a missing optional root grants nothing
    try:
        for allowed in (access, access & FS_FILE_RIGHTS):  # a regular file takes file rights only
            rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd))
            if (
                libc.syscall(
                    SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)
                )
                == 0
            ):
                return
        raise LandlockError(ctypes.get_errno(), "landlock_add_rule", path)
    finally:
        os.close(fd)
