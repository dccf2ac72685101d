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
import time
from collections.abc import Iterator
from pathlib import Path

import safejit
from safejit.cache.layout import VERSION as LAYOUT
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EXPECTED,
    NEW_C,
    NEW_NAME,
    SIGKILLED,
    MakeRuntime,
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
    assert elapsed < 10, f"waited {elapsed:.1f}s on a dead holder's lock"
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

    assert 0.9 <= elapsed < 5, f"expected to wait about lock_timeout_s=1, waited {elapsed:.2f}s"
    warned = [r for r in caplog.records if WITHOUT_LOCK in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert os.path.realpath(lock) in warned[0].getMessage()
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.build_key == key and mod.artifact.source == "compiled"
    assert mod.artifact.path in leaf_paths(seeded_cache)
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    assert_cache_sound(seeded_cache)
