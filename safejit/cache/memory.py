"""The memory tier: bounded, thread-safe, single-flight, revalidated.

Entries are bounded by count and by bytes and evicted in second-chance
(CLOCK) order, an LRU approximation that lets a hit mark an entry without
taking a lock. Each entry keeps its dependency list with stat snapshots; an
entry older than ``max_staleness_s`` since its last check is revalidated
(stat, then rehash only what changed) before it is returned.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..closure.hashing import Snapshot, hash_file, is_racy, snapshot_of

__all__ = ["Entry", "MemoryCache"]

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Entry(Generic[T]):
    value: T
    size: int
    #: [path, snapshot, digest, racy] — mutated in place by revalidation.
    deps: list[list[Any]] = field(default_factory=list)
    checked: float = 0.0
    ref: bool = False
    #: Paths that must still not exist (a new shadowing header makes the entry stale).
    negatives: tuple[str, ...] = ()
    #: False: the closure is unknown, so the entry never revalidates.
    trusted: bool = True
    #: (path as the request gave it, what it resolved to): a re-pointed path makes the entry stale.
    paths: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def dep_list(states: tuple[tuple[str, Snapshot, str], ...]) -> list[list[Any]]:
        now = time.time_ns()
        # An empty digest means "not vouched for": always rehashed, so always stale.
        return [[path, snap, digest, not digest or is_racy(snap, now)] for path, snap, digest in states]


class MemoryCache(Generic[T]):
    def __init__(
        self, *, max_entries: int, max_bytes: int, max_staleness_s: float, on_evict: Callable[[T], None] | None = None
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_staleness_s = max_staleness_s
        self.entries: OrderedDict[Hashable, Entry[T]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, Future[Entry[T]]] = {}
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self.entries)

    def fresh(self, entry: Entry[T], now: float) -> bool:
        """True when ``entry`` may be returned: checked recently, or revalidated now."""
        if now - entry.checked < self.max_staleness_s:
            return True
        return self.revalidate(entry, now)

    def revalidate(self, entry: Entry[T], now: float) -> bool:
        """Re-stat every dependency; rehash those whose stat moved (or is racy)."""
        if not entry.trusted:
            return False
        for given, resolved in entry.paths:
            if os.path.realpath(os.path.expanduser(given)) != resolved:
                return False
        wall = time.time_ns()
        for dep in entry.deps:
            path, snap, digest, racy = dep
            try:
                st = os.stat(path)
            except OSError:
                return False
            cur = snapshot_of(st)
            if cur == snap and not racy:
                continue
            try:
                new_digest, cur = hash_file(path)
            except OSError:
                return False
            if new_digest != digest:
                return False
            dep[1] = cur
            dep[3] = is_racy(cur, wall)
        for path in entry.negatives:
            if os.path.lexists(path):
                return False
        entry.checked = now
        return True

    def discard(self, key: Hashable, entry: Entry[T]) -> None:
        with self._lock:
            if self.entries.get(key) is entry:
                del self.entries[key]
                self.bytes -= entry.size

    def insert(self, key: Hashable, entry: Entry[T]) -> None:
        evicted: list[Entry[T]] = []
        with self._lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self.bytes -= old.size
            self.entries[key] = entry
            self.bytes += entry.size
            while len(self.entries) > self.max_entries or (self.bytes > self.max_bytes and len(self.entries) > 1):
                k, e = self.entries.popitem(last=False)
                if e.ref and e is not entry:
                    e.ref = False
                    self.entries[k] = e  # second chance
                    continue
                if e is entry:  # never evict what we are inserting while others remain
                    self.entries[k] = e
                    if len(self.entries) == 1:
                        break
                    continue
                self.bytes -= e.size
                self.evictions += 1
                evicted.append(e)
        if self._on_evict is not None:
            for e in evicted:
                self._on_evict(e.value)

    def single_flight(self, key: Hashable, produce: Callable[[], Entry[T]]) -> tuple[Entry[T], bool]:
        """Run ``produce`` once for concurrent callers of ``key``; returns (entry, produced_here)."""
        with self._lock:
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._inflight[key] = fut
        assert fut is not None
        if not owner:
            return fut.result(), False
        try:
            entry = produce()
        except BaseException as exc:
            with self._lock:
                self._inflight.pop(key, None)
            fut.set_exception(exc)
            raise
        self.insert(key, entry)
        with self._lock:
            self._inflight.pop(key, None)
        fut.set_result(entry)
        return entry, True

    def clear(self) -> list[Entry[T]]:
        with self._lock:
            out = list(self.entries.values())
            self.entries.clear()
            self.bytes = 0
        return out
