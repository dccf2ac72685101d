"""The memory tier: bounded, thread-safe, single-flight, revalidated — and the one
owner of ``max_staleness_s``.

Entries are bounded by count and by bytes and evicted in second-chance (CLOCK)
order, an LRU approximation that lets a hit mark an entry without taking a lock.
Each entry keeps its dependency list with stat snapshots and the time its closure
was last found current (``Entry.checked``). The guarantee (DESIGN.md §6): a value
returned to a call made at time *t* was built from dependency contents found
current at or after *t* − ``max_staleness_s``. So a call gets an entry as it is
only while that holds; otherwise the entry is revalidated first (stat, then rehash
only what changed) — also when the call joined a compile in flight, and also when
the entry's own publish or load was slow: the clock starts when the closure was
checked, never when the entry was stored.

:meth:`MemoryTier.get` is the hot path (one dict lookup and a clock read);
everything else happens in :meth:`MemoryTier.find` and :meth:`MemoryTier.produce`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from .. import _clock, _forksafe
from ..closure.hashing import RACY_WINDOW_NS, Snapshot, hash_file, is_racy, snapshot_of
from ..errors import LoadError
from ..outcomes import Miss, Tier
from ..telemetry import ATTR, SPAN, instruments, span

__all__ = ["Entry", "MemoryTier"]

T = TypeVar("T")


class _Negatives(Protocol):
    def hold(self) -> bool: ...


class _NoNegatives:
    def hold(self) -> bool:
        return True


_NONE = _NoNegatives()
#: What an entry's closure costs it, per dependency row (with its path's length) and per
#: negative lookup: :meth:`Entry.charge`.
_ROW_BYTES: Final = 360
_NEGATIVE_BYTES: Final = 300
#: What a compile's waiters are given when its owner was interrupted (not failed): try again.
_AGAIN: Any = object()
#: How often a waiter looks whether the compile it waits for was abandoned.
_WAIT_S = 1.0


def _abandoned(fut: Future[Any]) -> bool:
    """Whether the thread that owns ``fut`` has left the ``_single_flight`` call that
    registered it (a thread waiting on its own compile has: it is not compiling)."""
    owner = fut.owner  # type: ignore[attr-defined]
    if owner == threading.get_ident():
        return True
    frame = sys._current_frames().get(owner)
    while frame is not None:
        if frame.f_code is MemoryTier._single_flight.__code__ and frame.f_locals.get("mine") is fut:
            return False
        frame = frame.f_back
    return True


@dataclass(slots=True, eq=False)
class Entry(Generic[T]):
    """A value with what it was built from: ``deps`` rows ``[path, snapshot, digest,
    racy]`` (mutated in place by revalidation), the paths that must stay absent, and
    ``checked``, when (``_clock.now()``) its closure was last found current."""

    value: T
    size: int
    deps: list[list[Any]] = field(default_factory=list)
    checked: float = 0.0
    ref: bool = False
    negatives: _Negatives = _NONE
    #: False: the closure is unknown, so the entry never revalidates.
    trusted: bool = True
    #: (path as the request gave it, what it resolved to): a re-pointed path makes the entry stale.
    paths: tuple[tuple[str, str], ...] = ()
    #: ``toolchain(since)``: whether the toolchain the value was built with still stands,
    #: as it did at ``since`` (the entry's last check): a compiler replaced, a program
    #: it runs changed, an include dir it skipped made, make the entry stale.
    toolchain: Callable[[float], bool] | None = None

    @staticmethod
    def charge(artifact_bytes: int, states: tuple[tuple[str, Snapshot, str], ...], negatives: int) -> int:
        """What an entry holds, in bytes, as ``max_bytes`` counts it: the artifact, and the
        closure it keeps to revalidate (a dependency row ~360 bytes and its path, a negative
        lookup ~300, as measured with tracemalloc). The artifact alone was counted: an entry
        of 200,000 negative lookups (a tenant's probes) held 100 MiB counted as 16 KB."""
        return artifact_bytes + sum(_ROW_BYTES + len(path) for path, _, _ in states) + _NEGATIVE_BYTES * negatives

    @staticmethod
    def dep_list(states: tuple[tuple[str, Snapshot, str], ...]) -> list[list[Any]]:
        # An empty digest means "not vouched for": always rehashed, so always stale. The
        # racy test is is_racy's, inlined (mtime or ctime past the cutoff): a call per
        # row was a twentieth of a thousand-header hit.
        cutoff = time.time_ns() - RACY_WINDOW_NS
        return [[path, s, digest, not digest or s[3] > cutoff or s[4] > cutoff] for path, s, digest in states]


class MemoryTier(Generic[T]):
    """``max_entries`` / ``max_bytes`` bound it; ``on_evict`` is told of each evicted
    value. ``trace_hits``: every hit goes through :meth:`find` (with its span)."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        max_staleness_s: float,
        on_evict: Callable[[T], None] | None = None,
        trace_hits: bool = False,
        attrs: Mapping[str, str] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_staleness_s = max_staleness_s
        self.entries: OrderedDict[Hashable, Entry[T]] = OrderedDict()
        self._lookup = self.entries.get  # (the hot path's, bound once; ``entries`` is never replaced)
        self.bytes = 0
        self.evictions = 0
        #: Hits, counted in a plain int on the hot path (``safejit.cache.memory.hits``).
        self.hits = 0
        self._lock = _forksafe.Lock()
        self._closed = False
        self._inflight: dict[Hashable, Future[tuple[Entry[T], T]]] = {}
        self._on_evict = on_evict
        # The hot path's bound: none when every hit must be traced (find does the work).
        self._window = -1.0 if trace_hits else max_staleness_s
        self._attrs = dict(attrs or {})
        _tiers.add(self)

    def _after_fork(self) -> None:
        """In a forked child: the compiles in flight have no thread there to finish them
        (and the hits are the child's own from now on)."""
        self._inflight = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self.entries)

    # -- lookups ---------------------------------------------------------------
    def get(self, key: Hashable, now: float) -> T | None:
        """The value of ``key`` if its closure was checked within the window before
        ``now`` (the call's time), else None: then :meth:`find`. Raises ``TypeError``
        for an unhashable key."""
        entry = self._lookup(key)
        if entry is not None and now - entry.checked < self._window:
            entry.ref = True
            self.hits += 1
            return entry.value
        return None

    def find(self, key: Hashable, now: float) -> T | Miss:
        """The value of ``key`` for a call made at ``now``, revalidated when its window
        has passed; else why not (``absent``, or ``stale``: the entry is dropped). A miss
        is counted by :meth:`produce`, once the call is known not to be served from
        memory all the same; a hit within its window (one traced: ``trace_hits``) is
        counted as the fast path's are, in ``hits`` only."""
        entry = self.entries.get(key)
        if entry is None:
            with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: Tier.MEMORY, ATTR.RESULT: "miss", ATTR.REASON: Miss.ABSENT}):
                pass
            return Miss.ABSENT
        with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: Tier.MEMORY}) as s:
            within = now - entry.checked < self.max_staleness_s
            fresh = within or self.revalidate(entry, _clock.now())
            result, reason = ("hit", "fresh" if within else "revalidated") if fresh else ("miss", Miss.STALE)
            s.set_attributes({ATTR.RESULT: result, ATTR.REASON: reason})
        if fresh:
            if not within:
                instruments.lookup(Tier.MEMORY, "hit", "revalidated", self._attrs)
            entry.ref = True
            self.hits += 1
            return entry.value
        self.discard(key, entry)
        return Miss.STALE

    def fresh(self, entry: Entry[T], now: float) -> bool:
        """Whether ``entry`` may be returned to a call made at ``now``: its closure was
        checked since ``now - max_staleness_s``, or is found current again now."""
        if now - entry.checked < self.max_staleness_s:
            return True
        return self.revalidate(entry, _clock.now())

    def revalidate(self, entry: Entry[T], now: float) -> bool:
        """Re-stat every dependency; rehash those whose stat moved (or is racy); ask
        whether the toolchain stands. ``now``: when this check started (the entry's new
        ``checked``)."""
        if not entry.trusted:
            return False
        for given, resolved in entry.paths:
            if os.path.realpath(os.path.expanduser(given)) != resolved:
                return False
        if entry.toolchain is not None and not entry.toolchain(entry.checked):
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
        if not entry.negatives.hold():
            return False
        entry.checked = now
        return True

    # -- producing -------------------------------------------------------------
    def produce(
        self, key: Hashable, make: Callable[[], tuple[Entry[T], T]], now: float, missed: Miss = Miss.ABSENT
    ) -> T:
        """The value of ``key`` for a call made at ``now``, which :meth:`find` missed
        (``missed``: why). ``make`` returns the entry to keep and what its caller gets; it
        runs once for concurrent callers, who get the same — but a caller that joined one
        in flight gets it only if the entry is fresh for that caller's own time (else
        ``make`` runs again). Each call is counted once: a hit when it was served another
        caller's compile, else the miss (also when the compile failed)."""
        served = False
        try:
            while True:
                entry, made, mine = self._single_flight(key, make)
                if mine:
                    return made
                if self.fresh(entry, now):
                    self.hits += 1  # (served from memory: another caller's compile, waited for)
                    served = True
                    return made
                self.discard(key, entry)
        finally:
            if not served:
                instruments.lookup(Tier.MEMORY, "miss", missed, self._attrs)

    def _single_flight(self, key: Hashable, make: Callable[[], tuple[Entry[T], T]]) -> tuple[Entry[T], T, bool]:
        again = False
        while True:
            mine: Future[Any] = Future()
            mine.owner = threading.get_ident()  # type: ignore[attr-defined]  # (see _wait)
            owner = False
            # Registered and then settled and let go within one ``try``, whatever happens, an
            # exception raised in this thread between two statements (a signal handler's)
            # included: a future left in flight would hold every later caller of the key for good.
            try:
                with self._lock:
                    kept = self.entries.get(key) if again else None
                    if kept is not None:  # (a waiter that took over was quicker: its entry, as a hit's)
                        return kept, kept.value, False
                    fut = self._inflight.get(key)
                    if fut is not None and fut.done():  # (settled, its owner interrupted before letting it go)
                        del self._inflight[key]
                        fut = None
                    if fut is None:
                        owner = True
                        self._inflight[key] = mine
                if owner:
                    entry, made = make()
                    self.insert(key, entry)
                    mine.set_result((entry, made))
                    return entry, made, True
            except Exception as exc:
                if not mine.done():
                    mine.set_exception(exc)  # (the compile's error is every waiter's)
                raise
            finally:
                if owner:
                    if not mine.done():  # (a KeyboardInterrupt, a SystemExit: this thread's own,
                        mine.set_result(_AGAIN)  # not its waiters': one of them compiles instead)
                    with self._lock:
                        if self._inflight.get(key) is mine:
                            del self._inflight[key]
            assert fut is not None
            got = self._wait(key, fut)
            if got is not _AGAIN:
                entry, made = got
                return entry, made, False
            again = True

    def _wait(self, key: Hashable, fut: Future[Any]) -> Any:
        """Another caller's compile of ``key``: its result, its error raised, or _AGAIN
        when its owner left without settling it — interrupted twice (the second time
        in its ``finally``), or inside ``set_result`` before waking its waiters. Looked
        at once a second; an abandoned future is let go."""
        while True:
            try:
                return fut.result(timeout=0 if fut.owner == threading.get_ident() else _WAIT_S)  # type: ignore[attr-defined]
            except TimeoutError:
                if fut.done():  # (settled meanwhile: what it holds, an error of the compile's own too)
                    return fut.result()
                if not _abandoned(fut):
                    continue
            with self._lock:
                if self._inflight.get(key) is fut:
                    del self._inflight[key]
            return _AGAIN

    # -- bookkeeping -----------------------------------------------------------
    def discard(self, key: Hashable, entry: Entry[T]) -> None:
        with self._lock:
            if self.entries.get(key) is entry:
                del self.entries[key]
                self.bytes -= entry.size

    def discard_if(self, key: Hashable, drop: Callable[[T], bool]) -> None:
        """Drop the entry of ``key`` if ``drop`` says so of its value."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is not None and drop(entry.value):
                del self.entries[key]
                self.bytes -= entry.size

    def insert(self, key: Hashable, entry: Entry[T]) -> None:
        evicted: list[Entry[T]] = []
        with self._lock:
            if self._closed:
                raise LoadError("the runtime is closed")
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

    def clear(self) -> list[Entry[T]]:
        with self._lock:
            out = list(self.entries.values())
            self.entries.clear()
            self.bytes = 0
        return out

    def close(self) -> list[Entry[T]]:
        """:meth:`clear`, for good: an entry made after this (a compile under way as its
        owner closed) is refused (``LoadError``) and never served."""
        with self._lock:
            self._closed = True
        return self.clear()


#: Every memory tier of this process, for the fork hook.
_tiers: weakref.WeakSet[MemoryTier[Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for tier in list(_tiers):
        tier._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
