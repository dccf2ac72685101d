"""MemoryTier against a dict model: bounds, byte accounting, no wrong value, CLOCK order.

The model maps each key to the Entry last inserted for it (and not discarded
since). The cache may have evicted keys the model still holds, but whatever
it holds must be exactly the model's entry. Each insert is also checked
against the second-chance rules: the inserted entry survives, unreferenced
entries go oldest first and before any referenced one, and eviction stops as
soon as the bounds hold again.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from safejit.cache.memory import Entry, MemoryTier

keys = st.integers(0, 5)
sizes = st.integers(0, 40)


class Boom(Exception):
    pass


class MemoryTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache: MemoryTier[int] | None = None
        self.model: dict[Hashable, Entry[int]] = {}
        self.evicted: list[int] = []
        self.serial = itertools.count()

    @initialize(max_entries=st.integers(1, 4), max_bytes=st.integers(0, 200))
    def make_cache(self, max_entries: int, max_bytes: int) -> None:
        self.cache = MemoryTier(
            max_entries=max_entries, max_bytes=max_bytes, max_staleness_s=3600.0, on_evict=self.evicted.append
        )

    @property
    def c(self) -> MemoryTier[int]:
        assert self.cache is not None
        return self.cache

    def _new_entry(self, size: int) -> Entry[int]:
        return Entry(value=next(self.serial), size=size, checked=time.monotonic())

    def _inserting(self, key: int, entry: Entry[int], do: Callable[[], None]) -> None:
        """Run ``do`` (which inserts ``entry`` under ``key``) and check the eviction it made."""
        c = self.c
        before = [(k, e, e.ref) for k, e in c.entries.items() if k != key]
        evictions_before, evicted_before = c.evictions, len(self.evicted)
        do()
        self.model[key] = entry
        new_evicted = self.evicted[evicted_before:]

        # The entry being inserted is never the one evicted.
        assert c.entries.get(key) is entry
        gone = [(k, e, ref) for k, e, ref in before if c.entries.get(k) is not e]
        # Every entry that left was evicted, reported once, and counted.
        assert sorted(new_evicted) == sorted(e.value for _, e, _ in gone)
        assert c.evictions - evictions_before == len(gone)
        # Second chance: unreferenced entries go oldest first, referenced ones
        # only once every unreferenced one has gone.
        unref = [k for k, _, ref in before if not ref]
        gone_unref = [k for k, _, ref in gone if not ref]
        assert gone_unref == unref[: len(gone_unref)], "an unreferenced entry was evicted before an older one"
        if any(ref for _, _, ref in gone):
            assert gone_unref == unref, "a referenced entry was evicted while an unreferenced one remained"
        if gone:
            spared = sum(ref for _, _, ref in before) - sum(ref for _, _, ref in gone)
            event(f"insert evicted a referenced entry: {any(ref for _, _, ref in gone)}")
            event(f"insert evicted while sparing a referenced entry: {spared > 0}")
        # Eviction stops as soon as both bounds hold again.
        if new_evicted:
            last = next(e for _, e, _ in gone if e.value == new_evicted[-1])
            assert len(c.entries) + 1 > c.max_entries or c.bytes + last.size > c.max_bytes, "evicted one too many"

    @rule(key=keys, size=sizes)
    def insert(self, key: int, size: int) -> None:
        entry = self._new_entry(size)
        self._inserting(key, entry, lambda: self.c.insert(key, entry))

    @rule(data=st.data())
    def lookup_a_held_key(self, data: st.DataObject) -> None:
        if self.c.entries:
            self.lookup(data.draw(st.sampled_from(list(self.c.entries)), label="key"))

    @rule(key=keys)
    def lookup(self, key: int) -> None:
        entry = self.c.entries.get(key)
        if entry is None:
            return
        assert key in self.model, "the cache returned a key that was never inserted (or was discarded)"
        assert entry is self.model[key], "the cache returned a value that is not the last one inserted"
        assert self.c.fresh(entry, time.monotonic())
        entry.ref = True  # what a hit does in Runtime

    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        if not self.model:
            return
        key = data.draw(st.sampled_from(sorted(self.model)), label="key")
        entry = self.model.pop(key)
        evictions = self.c.evictions
        self.c.discard(key, entry)
        assert key not in self.c.entries
        assert self.c.evictions == evictions

    @rule(key=keys, size=sizes)
    def discard_a_stale_entry(self, key: int, size: int) -> None:
        # Discarding an entry that is not the cached one (a revalidation that
        # lost a race with a newer insert) must leave the newer one alone.
        held = self.c.entries.get(key)
        self.c.discard(key, self._new_entry(size))
        assert self.c.entries.get(key) is held

    @rule(key=keys, size=sizes)
    def single_flight(self, key: int, size: int) -> None:
        entry = self._new_entry(size)
        calls: list[int] = []

        def produce() -> tuple[Entry[int], int]:
            calls.append(1)
            return entry, -entry.value

        result: list[int] = []
        self._inserting(key, entry, lambda: result.append(self.c.produce(key, produce, time.monotonic())))
        assert result == [-entry.value]
        assert calls == [1]

    @rule(key=keys, size=sizes)
    def single_flight_that_fails(self, key: int, size: int) -> None:
        snapshot = [(k, e) for k, e in self.c.entries.items()]
        nbytes = self.c.bytes

        def produce() -> tuple[Entry[int], int]:
            raise Boom

        with pytest.raises(Boom):
            self.c.produce(key, produce, time.monotonic())
        assert list(self.c.entries.items()) == snapshot
        assert self.c.bytes == nbytes
        # The failed flight left nothing behind: the next caller produces anew.
        entry = self._new_entry(size)
        result: list[int] = []
        self._inserting(key, entry, lambda: result.append(self.c.produce(key, lambda: (entry, entry.value), 0.0)))
        assert result == [entry.value]

    @rule()
    def clear(self) -> None:
        held = list(self.c.entries.values())
        evictions = self.c.evictions
        out = self.c.clear()
        assert out == held
        assert self.c.evictions == evictions
        self.model.clear()

    @invariant()
    def within_bounds(self) -> None:
        if self.cache is None:
            return
        c = self.c
        assert len(c) == len(c.entries) <= c.max_entries
        assert c.bytes == sum(e.size for e in c.entries.values())
        assert c.bytes <= c.max_bytes or len(c.entries) == 1

    @invariant()
    def never_a_wrong_value(self) -> None:
        if self.cache is None:
            return
        for key, entry in self.c.entries.items():
            assert key in self.model
            assert entry is self.model[key]

    @invariant()
    def evictions_are_reported(self) -> None:
        if self.cache is None:
            return
        assert self.c.evictions == len(self.evicted)
        assert not self.c._inflight


TestMemoryTier = MemoryTierMachine.TestCase
TestMemoryTier.settings = settings(stateful_step_count=40)
