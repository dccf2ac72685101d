"""Liveness of what processes leave in shared places (``safejit._proc``): by a lock the
owner holds on its mark while it lives, never by its pid, which a process of another
PID namespace sharing the directory (a container's /dev/shm) would take for dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from safejit import _proc

HOLD = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()  # (until told to end)
"""


def test_an_owner_that_holds_its_mark_is_alive_whatever_its_pid_and_one_that_ended_is_swept(tmp_path):
    base = str(tmp_path)
    token = f"x-p{2**22 + 3}.{os.urandom(6).hex()}"  # (a pid that is no process here)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, os.path.join(base, token + ".alive")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        (tmp_path / f"{token}-work").mkdir()
        removed: list[str] = []
        _proc.sweep(base, "x-", removed.append)
        assert not _proc.ended(base, token) and removed == []
    finally:
        holder.communicate(b"")
    _proc.sweep(base, "x-", removed.append)
    assert removed == [str(tmp_path / f"{token}-work")]
    assert not (tmp_path / f"{token}.alive").exists()


def test_this_processes_token_is_its_own_alive_and_a_forked_child_takes_another(tmp_path):
    base = str(tmp_path)
    mine = _proc.owner(base, "y-")
    assert mine.startswith(f"y-p{os.getpid()}.") and _proc.owner(base, "y-") == mine
    assert not _proc.ended(base, mine)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, _proc.owner(base, "y-").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert child != mine and child.startswith(f"y-p{pid}.")
    assert not _proc.ended(base, mine)
    # (the child's mark, unlocked at its end and left by os._exit: ended)
    assert _proc.ended(base, child)


def test_a_mark_not_ours_or_a_token_without_one_is_never_taken_for_ended(tmp_path):
    assert not _proc.ended(str(tmp_path), "z-p1.000000000000")  # (no mark: made before marks)
    (tmp_path / "z-p1.111111111111.alive").symlink_to("/etc/hostname")
    assert not _proc.ended(str(tmp_path), "z-p1.111111111111")  # (not followed)


def test_a_mark_is_never_seen_unlocked(tmp_path, monkeypatch):
    """The mark was made under its own name and locked after: a sweep (or gc) in another
    process between the two took its owner for ended and removed it."""
    import fcntl

    from safejit import _proc

    seen = []
    real = fcntl.flock

    def flock(fd, op):
        seen.append(sorted(n for n in os.listdir(tmp_path) if n.endswith(".alive")))
        return real(fd, op)

    monkeypatch.setattr(_proc.fcntl, "flock", flock)
    monkeypatch.setattr(_proc, "_marks", {})
    token = _proc.owner(str(tmp_path))
    assert seen == [[]]  # (nothing by the mark's name before it is locked)
    assert (tmp_path / f"{token}.alive").exists() and not _proc.ended(str(tmp_path), token)


FORKS_THEN_ENDS = r"""
import os, sys, time
from safejit import _proc
from safejit.cache.fsio import lock_file
print(_proc.owner(sys.argv[1]), flush=True)
held = lock_file(sys.argv[2], 5)
child = os.fork()
if child == 0:  # a worker, forked while the build lock and the mark are held
    os.close(0), os.close(1)
    time.sleep(60)
    os._exit(0)
held.release()
print(child, flush=True)
sys.stdin.read()  # (until told to end)
"""


def test_a_forked_child_holds_neither_its_parents_build_lock_nor_its_mark(tmp_path):
    """A child forked while its parent held a build lock shared the lock's open file
    description: released by the parent, the lock stayed held while the child lived
    (every later build of the key on the node waited out its lock timeout); the same
    with the parent's owner mark (its scratch dirs never swept after it
    ended). A child closes its copies at the fork."""
    from safejit.cache.fsio import lock_file

    base, lock = str(tmp_path / "marks"), str(tmp_path / "k.lock")
    os.mkdir(base)
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKS_THEN_ENDS, base, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        token = parent.stdout.readline().strip()
        child = int(parent.stdout.readline())
        try:
            got = lock_file(lock, 2)  # (the parent let it go; its child lives on)
            assert got is not None
            got.release()
            assert not _proc.ended(base, token)
            parent.kill()  # (killed: its mark is left, for sweeps to find unlocked)
            parent.wait(30)
            assert _proc.ended(base, token)  # (its child still lives)
        finally:
            os.kill(child, signal.SIGKILL)
    finally:
        parent.kill()
        parent.communicate()


def test_no_fork_lands_between_a_lock_files_open_and_its_registration(tmp_path):
    """A lock file's descriptor was registered (for a forked child to close) only after
    its open returned, and unregistered before its close: a fork from another thread in
    between left the child holding the build lock (435 of 3,000 forks while a thread
    took and released it). Open+register and unregister+close exclude fork now."""
    import threading

    from safejit.cache.fsio import lock_file

    path = str(tmp_path / "k.lock")
    real = os.path.realpath(path)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            held = lock_file(path, 1)
            if held is not None:
                held.release()

    locker = threading.Thread(target=churn)
    locker.start()
    kept = 0
    try:
        for _ in range(300):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child: does it hold a descriptor of the lock file?)
                mine = [f for f in os.listdir("/proc/self/fd") if _names(f"/proc/self/fd/{f}", real)]
                os.write(write, b"1" if mine else b"0")
                os._exit(0)
            os.close(write)
            kept += os.read(read, 1) == b"1"
            os.close(read)
            os.waitpid(pid, 0)
    finally:
        stop.set()
        locker.join(10)
    assert kept == 0


def _names(link: str, target: str) -> bool:
    try:
        return os.readlink(link) == target
    except OSError:
        return False
