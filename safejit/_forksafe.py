"""Locks a forked child gets afresh.

``fork()`` copies a lock as it is: one that another thread held at that moment is held
for good in the child, where that thread does not exist, and the child's next use of it
waits forever. A :class:`Lock` is replaced by an unlocked one in every child (what it
guarded is then the child's own, as each user of one arranges: ``Runtime`` wires new
parts, the memory tier forgets the compiles in flight).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["Lock"]


class Lock:
    """A ``threading.Lock`` (``with``, ``acquire``, ``release``, ``locked``) that is
    unlocked again in a forked child."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _locks.add(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


_locks: weakref.WeakSet[Lock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
