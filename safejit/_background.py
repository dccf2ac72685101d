"""A small per-process thread pool for filesystem work kept off a compile's path
(preparing work dirs, deleting them, the shim started ahead, a directory fsync).
Shared by the cache and the sandbox; ``settle`` waits for it (tests, shutdown)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from . import _forksafe

__all__ = ["background", "settle"]

T = TypeVar("T")

_pool_lock = _forksafe.Lock()
_pool: tuple[int, _Pool] | None = None


class _Pool(ThreadPoolExecutor):
    """A thread pool that knows its unfinished work (for :func:`settle`)."""

    def __init__(self) -> None:
        super().__init__(max_workers=4, thread_name_prefix="safejit-io")
        self.unfinished: set[Future[Any]] = set()
        self._track = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        try:
            future = super().submit(fn, *args, **kwargs)
        except RuntimeError:  # the interpreter is exiting (no new work for threads): do it here
            future = Future()
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as exc:
                future.set_exception(exc)
            return future
        with self._track:
            self.unfinished.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._track:
            self.unfinished.discard(future)


def background() -> ThreadPoolExecutor:
    """This process's small pool for filesystem work off the critical path (per pid:
    a forked child has no threads, so it gets its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), _Pool())
        return _pool[1]


def settle() -> None:
    """Wait until this process's background filesystem work is done."""
    pool = _pool[1] if _pool is not None and _pool[0] == os.getpid() else None
    while pool is not None and pool.unfinished:
        wait(list(pool.unfinished))
