"""A wait on a process never outlives that process (issue 17: a run stayed for its full
timeout in the wait loop, polling a compiler whose return code was already 137).

The ways a wait could miss an exit: a pidfd opened after the process was reaped (so
naming whatever took its pid), no pidfd and Popen's lock held by another thread (so
``poll()`` answers "running"), and a status taken by another waiter (which Popen
reports as a success). Each is forced here; each wait must end within moments of the
exit, and a lost status must never read as success.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from safejit.sandbox._wait import OutputLog, exited, wait_for_exit


@pytest.fixture
def short() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process that prints and exits after 0.2 s, and the read end of its output."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    proc = subprocess.Popen(["sh", "-c", "echo hi; sleep 0.2; exit 3"], stdout=write_fd)
    os.close(write_fd)
    yield proc, read_fd
    os.close(read_fd)
    if proc.returncode is None:
        proc.kill()
        proc.wait()


def _timed(proc: subprocess.Popen[bytes], read_fd: int, pidfd: int = -1) -> tuple[int, float]:
    started = time.monotonic()
    rc, reported = wait_for_exit(proc, 30, read_fd, OutputLog(), pidfd=pidfd)
    assert not reported
    return rc, time.monotonic() - started


def test_a_wait_ends_at_the_exit(short):
    proc, read_fd = short
    rc, took = _timed(proc, read_fd, os.pidfd_open(proc.pid))
    assert rc == 3 and took < 5


def test_a_wait_without_pidfd_does_not_need_popens_lock(short):
    """Another thread holds Popen's waitpid lock (as one blocked in ``proc.wait()`` would):
    ``poll()`` then says "running" whatever the truth."""
    proc, read_fd = short
    assert proc._waitpid_lock.acquire()  # type: ignore[attr-defined]
    try:
        rc, took = _timed(proc, read_fd)
    finally:
        proc._waitpid_lock.release()  # type: ignore[attr-defined]
    assert rc == 3 and took < 5


def _steal(proc: subprocess.Popen[bytes]) -> None:
    """Another waiter (a SIGCHLD handler, a stray ``os.wait()``) takes its status."""
    thief = threading.Thread(target=os.waitpid, args=(proc.pid, 0))
    thief.start()
    thief.join()


def test_a_process_reaped_by_another_waiter_ends_the_wait_and_is_no_success(short):
    proc, read_fd = short
    _steal(proc)
    rc, took = _timed(proc, read_fd)
    assert took < 5
    assert rc == -signal.SIGKILL  # its status is lost: never read as success


def test_a_pidfd_opened_at_the_start_still_names_the_process_once_reaped(short):
    proc, read_fd = short
    pidfd = os.pidfd_open(proc.pid)  # at the start: it cannot be another process's
    try:
        _steal(proc)
        rc, took = _timed(proc, read_fd, pidfd)
    finally:
        os.close(pidfd)
    assert took < 5 and rc == -signal.SIGKILL


def test_exited_tells_a_zombie_without_reaping_it(short):
    proc, _ = short
    assert not exited(proc)
    deadline = time.monotonic() + 10
    while not exited(proc) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exited(proc)
    assert proc.returncode is None  # (not reaped: Popen still gets its status)
    assert proc.wait() == 3
