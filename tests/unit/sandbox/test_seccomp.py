"""The seccomp filter (sandbox.seccomp), run through a BPF interpreter: it refuses
exactly the listed syscalls (with their errno), ``clone`` only with a namespace flag,
and kills any other architecture's calls; everything else is allowed."""

from __future__ import annotations

import errno
import struct

import pytest

from safejit.sandbox import seccomp

ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _run(prog: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the filter returns for a call (a classic BPF interpreter, for the opcodes it uses)."""
    insns = [struct.unpack("<HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    pc = acc = 0
    for _ in range(len(insns) + 1):  # (forward jumps only: never more steps than instructions)
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = data[k], pc + 1
            continue
        if code == 0x06:
            return k
        taken = {0x15: acc == k, 0x35: acc >= k, 0x25: acc > k, 0x45: bool(acc & k)}[code]
        pc += 1 + (jt if taken else jf)
    raise AssertionError("the filter never returned")


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_the_filter_refuses_exactly_what_is_listed(machine):
    prog = seccomp.program(machine)
    assert prog is not None and len(prog) // 8 < 256  # (jump offsets are one byte)
    table = seccomp.SYSCALLS[machine]
    denied = {table[name]: code for name, code in seccomp.DENIED.items()}
    for nr in range(1024):
        got = _run(prog, nr, ARCH[machine])
        if nr in denied:
            assert got == ERRNO | denied[nr], (machine, nr)
        else:
            assert got == ALLOW, (machine, nr)
    assert denied[table["socket"]] == errno.EACCES and denied[table["clone3"]] == errno.ENOSYS


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
@pytest.mark.parametrize("flag", [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000])
def test_clone_is_refused_with_any_namespace_flag_only(machine, flag):
    prog = seccomp.program(machine)
    assert prog is not None
    clone = seccomp.SYSCALLS[machine]["clone"]
    assert _run(prog, clone, ARCH[machine], 0x11 | flag) == ERRNO | errno.EPERM
    assert _run(prog, clone, ARCH[machine], 0x003D0F00 | 17) == ALLOW  # (a thread's flags)


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_another_architectures_calls_are_killed(machine):
    prog = seccomp.program(machine)
    assert prog is not None
    for arch in (0x40000003, 0xC000003E, 0xC00000B7, 0x40000028):  # i386, x86-64, arm64, arm
        if arch != ARCH[machine]:
            assert _run(prog, 1, arch) == KILL
    if machine == "x86_64":
        assert _run(prog, 0x40000000 | 41, ARCH[machine]) == KILL  # x32's socket


def test_no_table_no_filter():
    assert seccomp.program("sparc64") is None
