"""Fallback exec shim, used only when the C shim cannot be built: the same protocol
and walls as shim.c (see there: the report, the request, namespaces, the scratch
tmpfs, the unprivileged ids, rlimits, Landlock, seccomp, subreaper supervision), in
Python. Run as ``python -I -S _pyshim.py -R ...``: standard library only, and one
file (it imports nothing of the package): hence its length, past the style's ~450 lines. Unlike the C shim it
forks the program's process when the run is known, not ahead (it is the fallback:
simpler over faster)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import resource
import signal
import socket
import stat
import struct
import sys

_FS_FILE = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
_READ_X = (1 << 0) | (1 << 2) | (1 << 3)
_CLONE_NEWNS = 0x00020000
_PRELOAD_FD = 200  # (shim.c's PRELOAD_FD)
_CLONE_NEWUSER = 0x10000000
_MS_REC, _MS_SLAVE = 0x4000, 1 << 19
_PR_SET_PDEATHSIG, _PR_SET_KEEPCAPS, _PR_SET_SECCOMP, _PR_CAPBSET_DROP = 1, 8, 22, 24
_PR_SET_SECUREBITS = 28
_PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 36, 38, 47
_CAP_DAC_READ_SEARCH = 2
# The new mount API and Landlock: one numbering on every architecture (but alpha).
_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


#: Out of processes, memory or descriptors: for a moment, not for want of a wall (shim.c).
_SHORTAGE = frozenset({errno.EAGAIN, errno.ENOMEM, errno.ENFILE, errno.EMFILE})


def _die(code: int, what: str, err: int | None = None) -> None:
    err = ctypes.get_errno() if err is None else err
    sys.stderr.write(f"safejit-shim: {what}: {os.strerror(err) if err else 'failed'}\n")
    sys.stderr.flush()
    os._exit(123 if code in (126, 127) and err in _SHORTAGE else code)


def _fork() -> int:
    try:
        return os.fork()
    except OSError as exc:
        _die(126, "fork", exc.errno)
        raise  # (not reached)


def _sys(number: int, *args: object) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Ahead:
    """What is prepared before the run is known (the options after ``-R``)."""

    def __init__(self, argv: list[str]) -> None:
        self.userns = self.mntns = self.scratch = self.seccomp = self.nproc = False
        self.scratch_bytes = self.scratch_inodes = ""
        self.uid = self.gid = -1
        self.filter = b""
        self.mount_fd = -1
        self.landlock = 0
        opts = list(argv)
        if "-R" not in opts:
            _die(124, "usage: _pyshim.py -R [-U] [-T BYTES -i INODES] [-u UID -g GID] [-S HEX] [-L FILE]")
        opts.remove("-R")
        if "-U" in opts:
            opts.remove("-U")
            self.userns = True
        pairs = dict(zip(opts[::2], opts[1::2], strict=False))
        if len(opts) % 2 or set(pairs) - {"-T", "-i", "-u", "-g", "-S", "-L"}:
            _die(124, f"bad options {opts}")
        if "-T" in pairs:
            self.scratch, self.scratch_bytes, self.scratch_inodes = True, pairs["-T"], pairs["-i"]
        self.uid, self.gid = int(pairs.get("-u", -1)), int(pairs.get("-g", -1))
        if self.uid == 0 or self.gid == 0:
            _die(124, "-u/-g must not be root")
        self.filter = bytes.fromhex(pairs.get("-S", ""))
        self.preload = pairs.get("-L", "")

    def prepare(self) -> None:
        if self.userns:
            self.userns = self.mntns = self._enter_namespaces()
            if not self.userns and os.getuid() == 0 and _libc.unshare(_CLONE_NEWNS) == 0:
                if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_SLAVE), None) != 0:
                    _die(126, "mount --make-rslave /")
                self.mntns = True
        if self.scratch and self.mntns:
            self.mount_fd = self._make_tmpfs()
        self.scratch = self.mount_fd >= 0
        self.seccomp = bool(self.filter) and platform.machine() in _SYS_SECCOMP
        abi = _sys(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        self.landlock = max(abi, 0)
        release = tuple(int(p) for p in platform.release().split(".")[:2] if p.isdigit())
        self.nproc = (self.userns and release >= (5, 14)) or self.uid > 0

    def _enter_namespaces(self) -> bool:
        uid, gid = os.getuid(), os.getgid()
        if uid == 0 and self.uid > 0:
            read_end, write_end = os.pipe()
            target = os.getpid()
            helper = _fork()
            if helper == 0:  # outside the new namespace, with CAP_SETUID there: write the maps
                os.close(write_end)
                if os.read(read_end, 1) != b"x":
                    os._exit(1)
                try:
                    _write(f"/proc/{target}/uid_map", f"0 {self.uid} 1\n1 0 1\n")
                    _write(f"/proc/{target}/gid_map", f"0 {self.gid} 1\n1 0 1\n")
                except OSError as exc:
                    os._exit(2 if exc.errno in _SHORTAGE else 1)
                os._exit(0)
            os.close(read_end)
            unshared = _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) == 0
            failed = ctypes.get_errno()
            if unshared:
                os.write(write_end, b"x")
            os.close(write_end)
            _, status = os.waitpid(helper, 0)
            if not unshared and failed in _SHORTAGE:
                _die(126, "unshare", failed)
            if unshared and status != 0:
                _die(126, "uid_map", errno.EAGAIN if os.waitstatus_to_exitcode(status) == 2 else errno.EPERM)
            return bool(unshared)
        if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
            if ctypes.get_errno() in _SHORTAGE:
                _die(126, "unshare")  # (no namespace for a moment: not none to be had)
            return False
        try:
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            with contextlib.suppress(FileNotFoundError):
                _write("/proc/self/setgroups", "deny")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        except OSError:
            _die(126, "uid_map")
        return True

    def _make_tmpfs(self) -> int:
        fs = _sys(_SYS_FSOPEN, b"tmpfs", ctypes.c_uint(1))
        if fs < 0:
            return -1
        try:
            # (in the namespace's ids: as root, the unprivileged ids are its uid and gid 0)
            owner = (
                (0, 0)
                if self.uid > 0 and self.userns
                else (self.uid if self.uid > 0 else os.getuid(), self.gid if self.gid > 0 else os.getgid())
            )
            for key, value in (
                ("size", self.scratch_bytes),
                ("nr_inodes", self.scratch_inodes),
                ("mode", "0700"),
                ("uid", str(owner[0])),
                ("gid", str(owner[1])),
            ):
                if _sys(_SYS_FSCONFIG, fs, 1, key.encode(), value.encode(), 0) != 0:
                    return -1
            if _sys(_SYS_FSCONFIG, fs, 6, None, None, 0) != 0:
                return -1
            return _sys(_SYS_FSMOUNT, fs, ctypes.c_uint(1), ctypes.c_uint(0x2 | 0x4 | 0x8))
        finally:
            os.close(fs)

    def report(self, sock: socket.socket) -> None:
        uid = self.uid if self.uid >= 0 else os.getuid()
        line = (
            f"safejit-shim 2 userns={int(self.userns)} mntns={int(self.mntns)} scratch={int(self.scratch)} "
            f"seccomp={int(self.seccomp)} landlock={self.landlock} uid={uid} nproc={int(self.nproc)}\n"
        )
        try:
            socket.send_fds(sock, [line.encode()], [self.mount_fd] if self.mount_fd >= 0 else [])
        except (BrokenPipeError, ConnectionResetError):
            os._exit(0)


class Request:
    def __init__(self, args: list[str]) -> None:
        self.limits: dict[int, int] = {}
        self.ro: list[str] = []
        self.rw: list[str] = []
        self.env: dict[str, str] | None = None
        self.cwd = self.mount_dir = self.hand_dir = ""
        self.deny_net = False
        self.nproc = -1
        limits = {"-a": resource.RLIMIT_AS, "-c": resource.RLIMIT_CPU, "-f": resource.RLIMIT_FSIZE,
                  "-n": resource.RLIMIT_NOFILE}  # fmt: skip
        i = 0
        while i < len(args) and args[i] != "--":
            flag = args[i]
            if flag == "-N":
                self.deny_net = True
                i += 1
                continue
            if i + 1 >= len(args):
                _die(124, flag)
            value = args[i + 1]
            if flag in limits:
                self.limits[limits[flag]] = int(value)
            elif flag == "-p":
                self.nproc = int(value)
            elif flag == "-r":
                self.ro.append(value)
            elif flag == "-w":
                self.rw.append(value)
            elif flag == "-E":
                name, _, val = value.partition("=")
                self.env = {**(self.env or {}), name: val}
            elif flag == "-C":
                self.cwd = value
            elif flag == "-M":
                self.mount_dir = value
            elif flag == "-H":
                self.hand_dir = value
            else:
                _die(124, flag)
            i += 2
        self.prog = args[i + 1 :]
        if not self.prog:
            _die(124, "no program")


def _read_request(sock: socket.socket) -> list[str]:
    def exactly(n: int, what: str) -> bytes:
        got = b""
        while len(got) < n:
            try:
                chunk = sock.recv(n - len(got))
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                if not got and what == "header":
                    os._exit(0)  # the runner no longer needs this shim
                _die(124, f"request {what}")
            got += chunk
        return got

    size = int.from_bytes(exactly(4, "header"), "little")
    if not 0 < size <= 16 << 20:
        _die(124, "request length")
    body = exactly(size, "body")
    if not body.endswith(b"\0"):
        _die(124, "request not NUL-terminated")
    return [os.fsdecode(a) for a in body[:-1].split(b"\0")]


def _landlock_ruleset(req: Request, abi: int) -> int:
    """A ruleset for the request's roots (-1: none asked for, or no Landlock)."""
    if not (req.ro or req.rw) or abi < 1:
        return -1
    handled = (1 << 13) - 1
    handled |= (1 << 13) if abi >= 2 else 0
    handled |= (1 << 14) if abi >= 3 else 0
    handled |= (1 << 15) if abi >= 5 else 0
    net = 3 if req.deny_net and abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    attr = ctypes.create_string_buffer(struct.pack("QQQ", handled, net, scoped))
    size = 24 if scoped else (16 if net else 8)
    rs = _sys(444, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        _die(126, "landlock_create_ruleset")
    for paths, access in ((req.ro, _READ_X), (req.rw, handled)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except (FileNotFoundError, PermissionError):
                continue  # (grants nothing: see shim.c)
            for allowed in (access & handled, access & handled & _FS_FILE):
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd))
                if _sys(445, ctypes.c_int(rs), ctypes.c_int(1), rule, ctypes.c_uint32(0)) == 0:
                    break
            else:
                _die(126, path)
            os.close(fd)
    return rs


def _only_cap(keep: int) -> None:
    """Keep only capability ``keep`` (-1: none): bounding, effective, permitted,
    inheritable and ambient sets."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        if cap != keep and _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _die(126, "capbset")
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))
    bit = 1 << keep if keep >= 0 else 0
    data = ctypes.create_string_buffer(struct.pack("6I", bit, bit, bit, 0, 0, 0))
    if _sys(_SYS_CAPSET[platform.machine()], header, data) != 0:
        _die(126, "capset")
    if keep >= 0 and _libc.prctl(_PR_CAP_AMBIENT, 2, keep, 0, 0) != 0:
        _die(126, "ambient")


def _drop_to(ahead: Ahead, landlocked: bool) -> None:
    """As shim.c's drop_to: the unprivileged ids (uid and gid 0 of the user namespace),
    powerless but for CAP_DAC_READ_SEARCH under Landlock."""
    if ahead.uid <= 0:
        return
    uid, gid = (0, 0) if ahead.userns else (ahead.uid, ahead.gid)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    if ahead.userns and _libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        _die(126, "keepcaps")
    os.setresuid(uid, uid, uid)
    if ahead.userns:
        if _libc.prctl(_PR_SET_SECUREBITS, 0x1 | 0x2 | 0x20, 0, 0, 0) != 0:
            _die(126, "securebits")
        _only_cap(_CAP_DAC_READ_SEARCH if landlocked else -1)
    elif 0 in os.getresuid():
        _die(126, "still root")


def _enter_walls(ahead: Ahead, req: Request) -> None:
    rs = _landlock_ruleset(req, ahead.landlock)
    shim = os.getppid()
    _drop_to(ahead, rs >= 0)
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        _die(126, "pdeathsig")
    if os.getppid() != shim:
        os._exit(126)
    for res, wanted in (*req.limits.items(), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(res)
        value = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
        resource.setrlimit(res, (value, value))
    if ahead.nproc and req.nproc >= 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (req.nproc, req.nproc))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _die(126, "no_new_privs")
    if rs >= 0:
        if _sys(446, ctypes.c_int(rs), ctypes.c_uint32(0)) != 0:
            _die(126, "landlock_restrict_self")
        os.close(rs)
    if ahead.seccomp:
        prog = ctypes.create_string_buffer(ahead.filter)
        fprog = struct.pack("HxxxxxxP", len(ahead.filter) // 8, ctypes.addressof(prog))
        if _sys(_SYS_SECCOMP[platform.machine()], 1, 0, ctypes.create_string_buffer(fprog)) != 0:
            _die(126, "seccomp")


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


class _Stop(Exception):
    """SIGTERM from the runner: end the run now."""


def _stop(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop


def _supervise(ahead: Ahead, req: Request) -> int:
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _stop)
    child = _fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            _enter_walls(ahead, req)
            if req.env is not None:
                os.execve(req.prog[0], req.prog, req.env)  # noqa: S606 - exec of the argv list is the shim's job
            os.execv(req.prog[0], req.prog)  # noqa: S606
        except OSError as exc:
            _die(127, req.prog[0], exc.errno or 0)
        os._exit(127)
    code = 127
    try:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                code = code if code >= 0 else 128 - code
                break
    except _Stop:
        code = 137
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


_MAX_ENTRIES, _MAX_DEPTH, _MAX_OUTPUTS = 4096, 16, 256
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_regular(name: str, dir_fd: int) -> int:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError("not a regular file")
    return fd


def _copy(src: int, dst: int) -> None:
    while chunk := os.read(src, 1 << 16):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


def _copy_in(src: int, dst: int, owner: tuple[int, int] | None, depth: int, budget: list[int]) -> None:
    """As shim.c's copy_in."""
    if owner is not None:
        os.fchown(dst, *owner)
    for entry in os.scandir(src):
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            _die(126, "the work dir holds too much")
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(entry.name, stat.S_IMODE(st.st_mode), dir_fd=dst)
            s2, d2 = os.open(entry.name, _DIR, dir_fd=src), os.open(entry.name, _DIR, dir_fd=dst)
            _copy_in(s2, d2, owner, depth + 1, budget)
            os.close(s2)
            os.close(d2)
        elif stat.S_ISREG(st.st_mode):
            try:
                fin = _open_regular(entry.name, src)
            except OSError:
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            out = os.open(entry.name, flags, stat.S_IMODE(st.st_mode), dir_fd=dst)
            if owner is not None:
                os.fchown(out, *owner)
            _copy(fin, out)
            os.close(fin)
            os.close(out)


def _copy_back(src: int, dst: int) -> None:
    """As shim.c's copy_back."""
    for n, entry in enumerate(list(os.scandir(src))[:_MAX_OUTPUTS]):
        try:
            fin = _open_regular(entry.name, src)
        except OSError:
            continue
        tmp = f".out-{os.getpid()}-{n}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
            try:
                _copy(fin, out)
            finally:
                os.close(out)
            os.rename(tmp, entry.name, src_dir_fd=dst, dst_dir_fd=dst)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dst)
        finally:
            os.close(fin)


def _hand_over(fd: int, owner: tuple[int, int], depth: int, budget: list[int]) -> None:
    """As shim.c's hand_over."""
    os.fchown(fd, *owner)
    for entry in os.scandir(fd):
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            _die(126, "the work dir holds too much")
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o77:
            sub = os.open(entry.name, _DIR, dir_fd=fd)
            _hand_over(sub, owner, depth + 1, budget)
            os.close(sub)
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            os.chown(entry.name, *owner, dir_fd=fd, follow_symlinks=False)


def main(argv: list[str]) -> int:
    os.closerange(3, 1 << 16)
    sock = socket.socket(fileno=os.dup(0))
    ahead = Ahead(argv)
    ahead.prepare()
    if ahead.preload:  # (see shim.c's -L: left open for the program, as the shim's user)
        try:
            fd = os.open(ahead.preload, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass
        else:
            os.dup2(fd, _PRELOAD_FD, inheritable=True)
            os.close(fd)
    if _libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, once the maps are written: see shim.c
        _die(126, "dumpable")
    ahead.report(sock)
    req = Request(_read_request(sock))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    own = ahead.uid > 0
    owner = ((0, 0) if ahead.userns else (ahead.uid, ahead.gid)) if own else None
    work = scratch = -1
    try:
        if req.mount_dir:
            if ahead.mount_fd < 0:
                _die(125, "no scratch tmpfs for -M")
            work = os.open(req.mount_dir, _DIR)
            scratch = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=ahead.mount_fd)
            _copy_in(work, scratch, owner, 0, [_MAX_ENTRIES])
            if _sys(_SYS_MOVE_MOUNT, ahead.mount_fd, b"", -100, os.fsencode(req.mount_dir), 4) != 0:
                _die(126, "mount the scratch tmpfs")
        if ahead.mount_fd >= 0:
            os.close(ahead.mount_fd)
        if req.hand_dir and owner is not None:
            fd = os.open(req.hand_dir, _DIR)
            _hand_over(fd, owner, 0, [_MAX_ENTRIES])
            os.close(fd)
    except OSError as exc:
        sys.stderr.write(f"safejit-shim: the work dir: {exc}\n")
        sys.stderr.flush()
        os._exit(126)
    if req.cwd:
        try:
            os.chdir(req.cwd)
        except OSError:
            _die(126, "chdir")
    code = _supervise(ahead, req)
    if scratch >= 0:
        _copy_back(scratch, work)
    with contextlib.suppress(OSError):
        sock.send(f"exit {code}\n".encode())
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
