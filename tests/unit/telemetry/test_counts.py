"""What the metrics count, with the real SDK: one lookup outcome per request and tier
(whatever cache roots it took; a call served another caller's compile is a memory hit,
not also a miss), a memory-hits counter that never goes down when a Runtime closes,
compiler time of failed runs told apart by ``error.type``, and ``setup`` called twice."""

from __future__ import annotations

import gc
import threading
import uuid
from typing import Any

import pytest

import safejit
from safejit.telemetry import _sdk
from tests.conftest import metric_points

LOOKUP_KEYS = ("safejit.tier", "safejit.result", "safejit.reason")


def _tenant() -> str:
    return "t" + uuid.uuid4().hex[:10]


def _points(reader, name: str, tenant: str) -> list[Any]:
    return metric_points(reader, name, **{"safejit.tenant": tenant})


def _lookups(reader, tenant: str) -> dict[tuple[str, ...], int]:
    return {
        tuple(str(p.attributes.get(k)) for k in LOOKUP_KEYS): p.value
        for p in _points(reader, "safejit.cache.lookups", tenant)
    }


def _memory_hits(reader, tenant: str) -> int:
    return sum(p.value for p in _points(reader, "safejit.cache.memory.hits", tenant))


def test_one_request_is_one_disk_lookup_whatever_roots_it_takes(make_runtime, metric_reader, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    t = _tenant()
    rt = make_runtime(cache_dirs=(str(first), str(second)), tenant=t)
    rt.compile(safejit.Source("int one(void) { return 1; }", "one"))
    assert _lookups(metric_reader, t) == {("memory", "miss", "absent"): 1, ("disk", "miss", "absent"): 1}

    # A leaf in the second root only: a miss in the first and a hit in the second are one hit.
    t2 = _tenant()
    make_runtime(cache_dirs=(str(second),), tenant=t2).compile(safejit.Source("int two(void) { return 2; }", "two"))
    make_runtime(cache_dirs=(str(first), str(second)), tenant=t2).compile(
        safejit.Source("int two(void) { return 2; }", "two")
    )
    assert _lookups(metric_reader, t2)[("disk", "hit", "verified")] == 1
    assert _lookups(metric_reader, t2)[("disk", "miss", "absent")] == 1  # (the first runtime's own)


def test_a_call_served_another_callers_compile_is_a_memory_hit_and_not_a_miss(make_runtime, metric_reader, spans):
    t = _tenant()
    rt = make_runtime(tenant=t)
    src = safejit.Source("int one(void) { return 1; }", "one")
    calls = 4
    barrier = threading.Barrier(calls)

    def call() -> None:
        barrier.wait()
        rt.compile(src)

    threads = [threading.Thread(target=call) for _ in range(calls)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    compiles = rt.stats()["compiles"]
    misses = _lookups(metric_reader, t).get(("memory", "miss", "absent"), 0)
    hits = _memory_hits(metric_reader, t)
    assert misses + hits == calls and misses == compiles, (misses, hits, compiles)
    tiers = sorted(str(s.attributes["safejit.tier"]) for s in spans.get_finished_spans() if s.name == "safejit.compile")
    assert tiers.count("compiled") == compiles and tiers.count("memory") == calls - compiles, tiers


def test_the_memory_hits_counter_never_goes_down_when_a_runtime_closes(make_runtime, metric_reader):
    t = _tenant()
    src = safejit.Source("int one(void) { return 1; }", "one")
    a, b = make_runtime(tenant=t), make_runtime(tenant=t)
    for _ in range(100):
        a.compile(src)
    for _ in range(10):
        b.compile(src)
    before = _memory_hits(metric_reader, t)
    assert before == 99 + 9  # (each runtime's first call compiled or hit the disk)
    a.close()
    assert _memory_hits(metric_reader, t) == before
    b.compile(src)
    assert _memory_hits(metric_reader, t) == before + 1
    # And when a runtime nobody closed is collected:
    c = safejit.Runtime(config=safejit.Config(cache_dirs=b.config.cache_dirs, tenant=t))
    for _ in range(3):
        c.compile(src)
    assert _memory_hits(metric_reader, t) == before + 1 + 2
    del c
    gc.collect()
    assert _memory_hits(metric_reader, t) == before + 1 + 2


def test_a_traced_memory_hit_is_counted_as_the_fast_paths_are(make_runtime, metric_reader, spans):
    t = _tenant()
    rt = make_runtime(tenant=t, trace_memory_hits=True)
    src = safejit.Source("int one(void) { return 1; }", "one")
    for _ in range(3):
        rt.compile(src)
    assert _lookups(metric_reader, t) == {("memory", "miss", "absent"): 1, ("disk", "miss", "absent"): 1}
    assert _memory_hits(metric_reader, t) == 2
    reasons = [
        s.attributes.get("safejit.reason") for s in spans.get_finished_spans() if s.name.endswith("memory.lookup")
    ]
    assert reasons == ["absent", "fresh", "fresh"], reasons


AT_LOAD = "void boom(void) __attribute__((constructor));\nvoid boom(void) {}\nint one(void) { return 1; }\n"


def _durations(reader, tenant: str) -> dict[str, int]:
    return {str(p.attributes.get("error.type")): p.count for p in _points(reader, "safejit.compile.duration", tenant)}


def test_compiler_time_of_a_failed_run_is_told_apart_by_its_error_type(make_runtime, metric_reader):
    t = _tenant()
    rt = make_runtime(tenant=t, compile_timeout_s=0.5)
    rt.compile(safejit.Source("int one(void) { return 1; }", "one"))
    with pytest.raises(safejit.CompileError):
        rt.compile(safejit.Source("int broken(void) { return }", "broken"))
    with pytest.raises(safejit.LoadTimeCodeError):
        rt.compile(safejit.Source(AT_LOAD, "one"))
    assert _durations(metric_reader, t) == {"None": 1, "CompileError": 1, "LoadTimeCodeError": 1}


def test_setup_twice_returns_what_the_first_call_did_or_refuses_other_settings(monkeypatch):
    # (the first call's settings as setup() keeps them: all of them, defaults included)
    first = {"console": False, "otlp_endpoint": None, "prometheus_port": None, "prometheus_addr": "127.0.0.1"}
    monkeypatch.setattr(_sdk, "_installed", ({**first, "memory": True, "service_name": "safejit"}, "first exporter"))
    assert _sdk.setup(memory=True) == "first exporter"
    with pytest.raises(safejit.ConfigError, match="called already"):
        _sdk.setup(memory=True, console=True)


def test_setup_after_a_program_installed_its_own_provider_says_so(otel_sdk):
    with pytest.raises(safejit.ConfigError, match="tracer provider is installed already"):
        _sdk.setup(memory=True)


@pytest.mark.parametrize("where", ["observe", "unregister"])
def test_a_runtime_let_go_from_within_the_observables_neither_hangs_nor_loses_its_hits(where):
    """A finalizer (a collection) or a signal handler's close() lets a runtime go on the
    thread that is reading the observables, or letting another runtime go: a lock taken
    there hung the process for good."""
    from safejit.telemetry import instruments

    attrs = {"safejit.tenant": _tenant()}
    reentered: list[int] = []

    def second() -> list[tuple[int, int, int, dict[str, str]]]:
        return [(5, 1, 10, attrs)]

    def first() -> list[tuple[int, int, int, dict[str, str]]]:
        if not reentered:
            reentered.append(1)
            instruments.unregister(second)  # (as a finalizer would, in the middle, on this thread)
        return [(3, 1, 10, attrs)]

    instruments.register(first)
    instruments.register(second)
    step = (lambda: instruments._observe(0)) if where == "observe" else (lambda: instruments.unregister(first))
    worker = threading.Thread(target=step, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and reentered
    try:
        hits = {tuple(o.attributes.items()): o.value for o in instruments._observe(0)}
        entries = {tuple(o.attributes.items()): o.value for o in instruments._observe(1)}
        assert hits[tuple(attrs.items())] == 8  # (both runtimes' hits stay, however they went)
        assert entries.get(tuple(attrs.items()), 0) == (1 if where == "observe" else 0)
    finally:
        instruments.unregister(first)


def test_runtimes_let_go_leave_nothing_behind_in_the_observables():
    """One Runtime per request for the life of a process: what the observables keep, and
    what a collection reads, stays the live runtimes' (it grew by one per runtime ever made)."""
    from safejit.telemetry import instruments

    attrs = {"safejit.tenant": _tenant()}
    before = len(instruments._sources)
    for _ in range(2000):

        def source() -> list[tuple[int, int, int, dict[str, str]]]:
            return [(1, 0, 0, attrs)]

        instruments.register(source)
        instruments.unregister(source)
    assert len(instruments._sources) == before and not instruments._leaving
    hits = {tuple(o.attributes.items()): o.value for o in instruments._observe(0)}
    assert hits[tuple(attrs.items())] == 2000


def test_a_forked_child_counts_its_own_hits_only(make_runtime, metric_reader):
    import os

    t = _tenant()
    src = safejit.Source("int one(void) { return 1; }", "one")
    warm = safejit.Runtime(config=safejit.Config(cache_dirs=make_runtime().config.cache_dirs, tenant=t))
    for _ in range(10):
        warm.compile(src)
    warm.close()
    assert _memory_hits(metric_reader, t) == 9
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, str(_memory_hits(metric_reader, t)).encode())
        os._exit(0)
    os.close(write)
    got = os.read(read, 100)
    os.close(read)
    os.waitpid(pid, 0)
    assert got == b"0"


def test_a_runtime_collected_while_the_observables_are_busy_keeps_nothing_alive(make_runtime, metric_reader):
    """Let go while another holder has the lock (a collection under way), a runtime's memory
    tier, and the modules in it, were kept until some later holder came by."""
    import weakref

    from safejit.telemetry import instruments

    t = _tenant()
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=make_runtime().config.cache_dirs, tenant=t))
    src = safejit.Source("int one(void) { return 1; }", "one")
    for _ in range(3):
        rt.compile(src)
    tier = weakref.ref(rt._memory)
    assert instruments._sources_lock.acquire(timeout=10)
    try:
        del rt
        gc.collect()
        assert tier() is None  # (its source swapped for its counts at once)
    finally:
        instruments._sources_lock.release()
    assert _memory_hits(metric_reader, t) == 2
