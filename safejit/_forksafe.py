"""Locks a forked child gets afresh.

``fork()`` copies a lock as it is: one that another thread held at that moment is held
for good in the child, where that thread does not exist, and the child's next use of it
waits forever. A :func:`Lock` is a real ``threading.Lock``, made unlocked again in every
child (``_at_fork_reinit``, as the standard library does for its own); what it guarded
is then the child's own, as each user of one arranges (``Runtime`` wires new parts, the
memory tier forgets the compiles in flight).

It is the C lock itself, not a wrapper: ``with`` acquires and releases it without a
Python frame in between, where a signal handler could raise (a ``KeyboardInterrupt``
between a wrapper's acquire and its return, or on entry to its ``__exit__``, left the
lock held for good).
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["Lock", "descriptors"]

_locks: weakref.WeakSet[threading.Lock] = weakref.WeakSet()

#: Held while a descriptor a forked child must not keep (a held lock's: a build lock, a
#: work dir's, an owner mark's) is opened and registered, or unregistered and closed —
#: and across ``fork()``: a child never inherits one half-registered, which it could
#: not close (the lock would stay held for as long as it lived).
descriptors = threading.Lock()


def Lock() -> threading.Lock:  # (named as threading.Lock, which it makes)
    """A ``threading.Lock`` that is unlocked again in a forked child."""
    lock = threading.Lock()
    _locks.add(lock)
    return lock


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._at_fork_reinit()  # type: ignore[attr-defined]


os.register_at_fork(before=descriptors.acquire, after_in_parent=descriptors.release)
os.register_at_fork(after_in_child=_after_fork_in_child)
os.register_at_fork(after_in_child=descriptors.release)  # (held by this, the only, thread: see before)
