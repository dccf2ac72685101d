"""Lock faults: the per-build-key lock is an optimisation, never a wait forever.

A holder that dies releases the lock with it (flock), so the next process
compiles at once; a holder that lives on is waited for ``lock_timeout_s``,
after which the compile goes ahead without the lock (publish is safe anyway).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import safejit
from safejit.cache import maintenance
from safejit.cache.layout import VERSION as LAYOUT
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EXPECTED,
    NEW_C,
    NEW_NAME,
    SIGKILLED,
    MakeRuntime,
    child_argv,
    child_env,
    kill_and_reap,
    leaf_paths,
    only_leaf,
    snapshot,
    start_child,
    wait_for,
)

#: How long the child "compiles" while holding the lock (it is killed long before).
HOLD_S = 30
WITHOUT_LOCK = "compiling without it"


def _new() -> safejit.Source:
    return safejit.Source(NEW_C, NEW_NAME)


def _lock_path(cache: Path, key: str) -> Path:
    return cache / LAYOUT / "locks" / f"{key}.lock"


def _is_held(path: Path) -> bool:
    """Whether another open file description holds ``path``'s flock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """Hold ``path``'s flock (as the runtime takes it) from this process until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _build_key(make_runtime: MakeRuntime, tmp_path: Path) -> str:
    """The build key of the new kernel, from a throwaway cache (keys do not name the root)."""
    throwaway = tmp_path / "throwaway"
    throwaway.mkdir()
    key: str = make_runtime(cache_dirs=(str(throwaway),)).build(_new()).build_key
    return key


def test_compile_after_lock_holder_sigkill_proceeds_promptly(seeded_cache, make_runtime, tmp_path, caplog):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    lock = _lock_path(seeded_cache, _build_key(make_runtime, tmp_path))
    # The child takes the lock, then sleeps where the compiler would start.
    child = start_child(seeded_cache, NEW_NAME, NEW_C, faults=f"compiler.spawn=delay:{HOLD_S}")
    try:
        wait_for(lambda: _is_held(lock), proc=child)
    finally:
        returncode = kill_and_reap(child)
    assert returncode == SIGKILLED
    assert leaf_paths(seeded_cache) == {earlier}

    rt = make_runtime(lock_timeout_s=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="safejit"):
        mod = rt.compile(_new())
    elapsed = time.monotonic() - started

    # Acquired, not timed out: the dead holder's flock went with it.
    assert not any(WITHOUT_LOCK in m for m in caplog.messages), "the dead holder's lock was not released"
    assert elapsed < 60, f"waited {elapsed:.1f}s on a dead holder's lock"  # (the log line above is the test)
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.build_key == lock.name.removesuffix(".lock")
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    assert not _is_held(lock), "the lock outlived the compile"
    assert snapshot(earlier) == earlier_bytes
    assert_cache_sound(seeded_cache)


def test_compile_with_live_lock_holder_times_out_and_compiles_without_it(seeded_cache, make_runtime, tmp_path, caplog):
    key = _build_key(make_runtime, tmp_path)
    lock = _lock_path(seeded_cache, key)
    rt = make_runtime(lock_timeout_s=1)
    with _held(lock):
        assert _is_held(lock)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="safejit"):
            mod = rt.compile(_new())
        elapsed = time.monotonic() - started
        assert _is_held(lock), "the holder lost its lock"

    # It waited the timeout (and then a compile, however slow on a loaded machine).
    assert 0.9 <= elapsed < 60, f"expected to wait about lock_timeout_s=1, waited {elapsed:.2f}s"
    warned = [r for r in caplog.records if WITHOUT_LOCK in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert os.path.realpath(lock) in warned[0].getMessage()
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.build_key == key and mod.artifact.source == "compiled"
    assert mod.artifact.path in leaf_paths(seeded_cache)
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    assert_cache_sound(seeded_cache)


def test_compile_waiting_on_a_stopped_holder_returns_the_leaf_another_process_published(
    seeded_cache, make_runtime, tmp_path
):
    """The holder of the build lock is stopped (SIGSTOP: a process paused in a debugger, a
    job suspended, a node swapping); another process, with a short lock timeout, compiles
    without the lock and publishes. A waiter on the default lock timeout looks at the disk
    again while it waits, and returns that leaf long before its timeout runs out."""
    key = _build_key(make_runtime, tmp_path)
    lock = _lock_path(seeded_cache, key)
    holder = start_child(seeded_cache, NEW_NAME, NEW_C, faults=f"compiler.spawn=delay:{HOLD_S}")
    result: dict[str, object] = {}
    try:
        wait_for(lambda: _is_held(lock), proc=holder)
        os.kill(holder.pid, signal.SIGSTOP)
        rt = make_runtime()  # the default lock timeout
        assert rt.config.lock_timeout_s >= 60

        def wait() -> None:
            try:
                result["module"] = rt.compile(_new())
            except BaseException as exc:
                result["error"] = exc
            result["done"] = time.monotonic()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(1.0)  # the waiter is waiting on the lock
        assert waiter.is_alive() and leaf_paths(seeded_cache) == {only_leaf(seeded_cache)}
        other = subprocess.run(
            child_argv(seeded_cache, NEW_NAME, NEW_C, lock_timeout=0.5),
            env=child_env(None),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        published = time.monotonic()
        assert other.returncode == 0, other.stderr
        assert other.stdout.split()[:2] == [str(EXPECTED[NEW_NAME]), "compiled"]
        waiter.join(30)  # generous for a loaded machine: the waiter looks every half second
        assert not waiter.is_alive(), "the waiter did not see the published leaf while it waited"
    finally:
        kill_and_reap(holder)  # (SIGKILL ends a stopped process too)
    assert "error" not in result, result.get("error")
    mod = result["module"]
    assert isinstance(mod, safejit.Module)
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME] and mod.artifact.source == "disk"
    assert rt.stats()["compiles"] == 0
    assert float(result["done"]) - published < 30  # type: ignore[arg-type]
    assert_cache_sound(seeded_cache)


#: A process that takes one build lock ``rounds`` times through ``fsio.lock_file`` (as
#: the runtime does), holding it a few milliseconds each time, and checks that nobody
#: else is inside meanwhile: a file only a holder makes, exclusively.
LOCKER = r"""
import os, sys, time
from safejit.cache.fsio import lock_file
path, inside, rounds, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
overlaps = taken = 0
for _ in range(rounds):
    lock = lock_file(path, 60.0)
    if lock is None:
        continue
    taken += 1
    try:
        fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        overlaps += 1
    else:
        os.close(fd)
        time.sleep(hold)
        os.unlink(inside)
    lock.release()
    time.sleep(hold / 2)
print(overlaps, taken)
"""


def test_gc_removes_idle_lock_files_and_never_lets_two_processes_hold_one_lock(cache_dir, tmp_path):
    """gc deletes lock files nobody holds (old enough), never one held; and while it
    deletes the lock file of a key over and over, four processes taking and releasing
    that key's lock (waiting on one another) are never inside at the same time: a waiter
    that gets the lock of a file gc removed meanwhile takes the one its path names now."""
    locks = cache_dir / LAYOUT / "locks"
    locks.mkdir(parents=True)
    idle, held = locks / ("a" * 64 + ".lock"), locks / ("b" * 64 + ".lock")
    idle.touch()
    held.touch()
    old = time.time() - 7200
    for path in (idle, held):
        os.utime(path, (old, old))
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(held), str(tmp_path / "held-inside"), "1", "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _is_held(held), proc=holder)
        os.utime(held, (old, old))
        counts = maintenance.gc(str(cache_dir), max_age_s=3600)
        assert counts["locks"] == 1 and not idle.exists()
        assert held.exists() and _is_held(held), "gc removed a lock file that was held"
    finally:
        kill_and_reap(holder)
    assert maintenance.gc(str(cache_dir), max_age_s=3600)["locks"] == 1 and not held.exists()

    busy = locks / ("c" * 64 + ".lock")
    inside = tmp_path / "inside"
    lockers = [
        subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(busy), str(inside), "40", "0.005"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    removed = 0
    try:
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in lockers) and time.monotonic() < deadline:
            removed += maintenance.gc(str(cache_dir), max_age_s=-1)["locks"]
        reports = [p.communicate(timeout=60) for p in lockers]
    finally:
        for p in lockers:
            if p.poll() is None:
                kill_and_reap(p)
    assert [p.returncode for p in lockers] == [0] * 4, [err for _, err in reports]
    overlaps, taken = zip(*((int(n) for n in out.split()) for out, _ in reports), strict=True)
    assert sum(overlaps) == 0, f"two processes held one lock at once {sum(overlaps)} times"
    assert sum(taken) == 160  # every locker got the lock every time (none timed out)
    assert removed > 0  # gc did remove the lock file while it was idle, in between
    assert_cache_sound(cache_dir)


def test_a_failed_reopen_never_closes_another_threads_lock(tmp_path, monkeypatch):
    """The lock file was replaced (gc) after it was opened: its descriptor is closed and
    the path opened again. When that open failed (a link planted there), the error path
    closed the old number once more — by then another thread's build lock, released
    under its holder."""
    import errno

    from safejit.cache import fsio

    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    real_open, real_ident = fsio._open_lock, fsio._ident
    opens, idents, other = [0], [0], []

    def open_lock(path: str, group: bool = False) -> int:
        opens[0] += 1
        if opens[0] == 2:  # (the re-open: another thread takes its lock first, on the freed number)
            other.append(fsio.lock_file(b, 1))
            raise OSError(errno.ELOOP, "a link planted where the lock file was", path)
        return real_open(path, group)

    def ident(path: str) -> tuple[int, int] | None:
        idents[0] += 1
        return (0, 0) if idents[0] == 1 else real_ident(path)  # ("removed by gc since it was opened")

    monkeypatch.setattr(fsio, "_open_lock", open_lock)
    monkeypatch.setattr(fsio, "_ident", ident)
    with pytest.raises(OSError, match="planted"):
        fsio.lock_file(a, 1)
    monkeypatch.undo()
    (held,) = other
    os.fstat(held._fd)  # (still open: still held)
    probe = "import sys; from safejit.cache.fsio import lock_file; print(lock_file(sys.argv[1], 0.3) is None)"
    out = subprocess.run([sys.executable, "-c", probe, b], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    held.release()
