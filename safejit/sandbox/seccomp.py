"""The seccomp filter every sandboxed compiler runs under: its one home (the syscall
numbers per architecture and the BPF program).

The program is built here and handed to the exec shim as hex (``-S``), which installs
it in the compiler's process right before ``execve``; both shims stay free of syscall
tables. What it refuses, and why a compiler never needs it:

- **network**: ``socket`` and ``socketpair`` (``EACCES``), for every address family —
  IP (TCP, UDP, raw), UNIX (pathname and abstract), netlink, packet, vsock. No other
  way to a socket remains: none is inherited, ``io_uring`` (which creates and connects
  sockets without these syscalls) is refused, and so is taking a descriptor from
  another process (``pidfd_getfd``).
- **other processes**: ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``.
- **namespaces and mounts**: ``unshare``, ``setns``, ``clone`` with a namespace flag,
  ``clone3`` (``ENOSYS``: its flags cannot be inspected; the C library falls back to
  ``clone``), and the mount calls: nothing can unmount the scratch tmpfs or build a
  namespace of its own to reach a network in.
- **kernel surface no compiler uses**: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  the key calls, ``open_by_handle_at`` (which opens a file without a path).

Any other architecture's syscalls (i386 or x32 on x86-64, arm32 on arm64) kill the
process: their numbers differ, and a filter that checked one table would let the
other through.
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Mapping
from typing import Final

__all__ = ["DENIED", "NAMESPACE_FLAGS", "SYSCALLS", "program", "program_hex"]

#: Syscall numbers, by ``platform.machine()``: x86-64's own table, and the generic one
#: arm64 uses (``asm-generic/unistd.h``). A test checks them against the installed headers.
SYSCALLS: Final[Mapping[str, Mapping[str, int]]] = {
    "x86_64": {
        "socket": 41, "socketpair": 53, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "pidfd_getfd": 438, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
        "request_key": 249, "open_by_handle_at": 304, "clone": 56, "clone3": 435,
    },
    "aarch64": {
        "socket": 198, "socketpair": 199, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "pidfd_getfd": 438, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217,
        "request_key": 218, "open_by_handle_at": 265, "clone": 220, "clone3": 435,
    },
}  # fmt: skip
_AUDIT_ARCH: Final = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
#: x86-64: syscall numbers with this bit set are x32's.
_X32_BIT: Final = 0x40000000

_MOUNTS: Final = (
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "mount_setattr",
)  # fmt: skip
#: What is refused, and with which errno.
DENIED: Final[Mapping[str, int]] = {
    "socket": errno.EACCES,
    "socketpair": errno.EACCES,
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"), errno.EPERM),
    **dict.fromkeys(("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"), errno.EPERM),
    **dict.fromkeys(("unshare", "setns"), errno.EPERM),
    **dict.fromkeys(_MOUNTS, errno.EPERM),
    **dict.fromkeys(
        ("bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "open_by_handle_at"), errno.EPERM
    ),
    "clone3": errno.ENOSYS,
}
#: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: a ``clone`` with any is refused.
NAMESPACE_FLAGS: Final = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Classic BPF, as seccomp reads it.
_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JGT_K: Final = 0x25  # BPF_JMP | BPF_JGT | BPF_K
_JSET_K: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K: Final = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS: Final = 0x80000000
_RET_ERRNO: Final = 0x00050000
_RET_ALLOW: Final = 0x7FFF0000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # (args[0]'s low word: both architectures are little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _ranges(table: Mapping[str, int]) -> list[tuple[int, int, int | None]]:
    """``(first, last, errno)`` over the denied numbers, ascending; adjacent numbers with
    the same errno merged; ``clone`` with errno None (its flags decide)."""
    marks = sorted([(table[name], code) for name, code in DENIED.items()] + [(table["clone"], None)])
    out: list[tuple[int, int, int | None]] = []
    for nr, code in marks:
        if out and code is not None and out[-1][2] == code and out[-1][1] == nr - 1:
            out[-1] = (out[-1][0], nr, code)
        else:
            out.append((nr, nr, code))
    return out


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (this one's by default) as ``struct sock_filter``
    records, or None where there is no table for it.

    After the architecture checks, the denied numbers as ascending ranges: a number
    below a range's first is allowed at once (the kernel emulates the filter for
    every syscall number when it is attached, to cache the always-allowed ones: the
    shorter the walk, the cheaper the attach)."""
    machine = machine or platform.machine()
    table = SYSCALLS.get(machine)
    if table is None:
        return None
    head = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, _AUDIT_ARCH[machine], jt=1),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    if machine == "x86_64":
        head += [_insn(_JGE_K, _X32_BIT, jf=1), _insn(_RET_K, _RET_KILL_PROCESS)]
    blocks = []  # (first, last, action instructions)
    for first, last, code in _ranges(table):
        if code is None:  # clone: refused with a namespace flag
            action = [
                _insn(_LD_W_ABS, _ARG0_LOW),
                _insn(_JSET_K, NAMESPACE_FLAGS, jf=1),
                _insn(_RET_K, _RET_ERRNO | errno.EPERM),
                _insn(_RET_K, _RET_ALLOW),
            ]
        else:
            action = [_insn(_RET_K, _RET_ERRNO | code)]
        blocks.append((first, last, action))
    body: list[bytes] = []
    sizes = [2 + len(action) for _, _, action in blocks]
    for i, (first, last, action) in enumerate(blocks):
        to_allow = sum(sizes[i + 1 :]) + len(action) + 1  # (from the JGE: past this block and the rest)
        body += [_insn(_JGE_K, first, jf=to_allow), _insn(_JGT_K, last, jt=len(action)), *action]
    return b"".join([*head, *body, _insn(_RET_K, _RET_ALLOW)])


def program_hex(machine: str | None = None) -> str | None:
    """:func:`program` as the shim's ``-S`` argument."""
    found = program(machine)
    return found.hex() if found is not None else None
