"""Remote faults with real sockets: a listener that never answers, a refused port, a
stopped server (SIGSTOP), a paused one (CLIENT PAUSE), a server killed mid-transfer,
and the injected fault points. Each costs a bounded time, ends as a RemoteError with
the right reason, opens the breaker, and the breaker recovers through its probe.

The time bounds are generous (a loaded 2-core machine): they catch a client waiting
for its library's default timeout (seconds), not milliseconds of scheduling noise."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from safejit import faults
from safejit.cache.remote import Breaker, BreakerPolicy, RemoteError

from ._servers import BlackHole, Proxy, free_port, start_valkey, stopped
from .conftest import hexkey

K = hexkey("k")
#: A fast probe, so that recovery fits in a test.
FAST = BreakerPolicy(probe_interval_s=0.3)
#: Upper bounds: a 50 ms deadline, a 100 ms S3 deadline.
REDIS_BOUND_S = 0.5
S3_BOUND_S = 0.8


def timed(fn: Callable[[], object]) -> tuple[str, float]:
    """``fn()``'s RemoteError reason and how long it took."""
    start = time.perf_counter()
    with pytest.raises(RemoteError) as info:
        fn()
    return info.value.reason, time.perf_counter() - start


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture
def black_hole():
    hole = BlackHole()
    yield hole
    hole.close()


@pytest.fixture
def private_valkey(tmp_path):
    """A server of this test's own, for faults that stop or kill it."""
    server = start_valkey(tmp_path / "valkey")
    yield server
    server.stop()


def transitions_of(store) -> list[tuple[str, str]]:
    return store._transitions  # set by the store factory below


@pytest.fixture
def store_with_transitions(make_store):
    def make(url: str, **kwargs):
        seen: list[tuple[str, str]] = []
        store = make_store(url, on_transition=lambda old, new: seen.append((old, new)), **kwargs)
        store._transitions = seen
        return store

    return make


# -- a listener that accepts and never answers --------------------------------


def test_lookup_against_a_black_hole_times_out_then_the_breaker_opens(black_hole, store_with_transitions):
    store = store_with_transitions(f"redis://127.0.0.1:{black_hole.port}/0")
    for _ in range(3):
        reason, took = timed(lambda: store.index(K))
        assert reason == "timeout"
        assert took < REDIS_BOUND_S
    assert transitions_of(store) == [("closed", "open")]
    before = black_hole.traffic()
    assert before[0] >= 1 and before[1] > 0  # (the timed-out calls reached it: it sees traffic)
    reason, took = timed(lambda: store.index(K))
    assert reason == "circuit_open"
    assert black_hole.traffic() == before  # no connection, no byte: refused before the network
    assert took < REDIS_BOUND_S


def test_s3_lookup_against_a_black_hole_times_out_then_the_breaker_opens(black_hole, store_with_transitions):
    url = f"s3://k:s@bucket-1/p?endpoint=http://127.0.0.1:{black_hole.port}&region=us-east-1"
    store = store_with_transitions(url, timeout_s=0.1)
    for _ in range(3):
        reason, took = timed(lambda: store.index(K))
        assert reason == "timeout"
        assert took < S3_BOUND_S
    assert transitions_of(store) == [("closed", "open")]
    assert timed(lambda: store.get_blob(K))[0] == "circuit_open"


def test_blob_put_against_a_black_hole_times_out(black_hole, make_store):
    store = make_store(f"redis://127.0.0.1:{black_hole.port}/0")
    reason, took = timed(lambda: store.put_blob(K, b"x" * 1000))
    assert reason == "timeout" and took < REDIS_BOUND_S


# -- nothing listening ---------------------------------------------------------


@pytest.mark.parametrize("engine", ["redis", "s3", "unix"])
def test_refused_connection_is_refused_quickly(engine, make_store, tmp_path):
    port = free_port()
    url = {
        "redis": f"redis://127.0.0.1:{port}/0",
        "s3": f"s3://k:s@bucket-1/p?endpoint=http://127.0.0.1:{port}&region=us-east-1",
        "unix": f"unix://{tmp_path}/no-such.sock",
    }[engine]
    store = make_store(url)
    reason, took = timed(lambda: store.index(K))
    assert reason == "refused"
    assert took < REDIS_BOUND_S


# -- a stopped server (SIGSTOP / SIGCONT) --------------------------------------


def test_stopped_server_times_out_opens_the_breaker_and_recovers_through_the_probe(private_valkey, make_store):
    seen: list[tuple[str, str]] = []
    breaker = Breaker(FAST, on_transition=lambda o, n: seen.append((o, n)))
    store = make_store(private_valkey.url, breaker=breaker)
    assert store.publish_manifest(K, hexkey("d"), b"m").value == "created"
    with stopped(private_valkey.pid):
        for _ in range(3):
            reason, took = timed(lambda: store.index(K))
            assert reason == "timeout"
            assert took < REDIS_BOUND_S
        assert breaker.state == "open"
        reason, took = timed(lambda: store.index(K))
        # (refused before any I/O: a call that had waited on the server would end "timeout")
        assert reason == "circuit_open" and took < REDIS_BOUND_S
        time.sleep(FAST.probe_interval_s)
        assert timed(lambda: store.index(K))[0] == "timeout"  # the probe, while still stopped
        assert breaker.state == "open"
    time.sleep(FAST.probe_interval_s)
    assert dict(store.index(K)) == {hexkey("d"): b"m"}  # the probe succeeds
    assert breaker.state == "closed"
    assert seen == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_stopped_server_bounds_a_large_transfer(private_valkey, make_store):
    store = make_store(private_valkey.url)
    data = os.urandom(4 << 20)
    store.put_blob(hexkey("big"), data)
    with stopped(private_valkey.pid):
        reason, took = timed(lambda: store.get_blob(hexkey("big"), size=len(data)))
    assert reason == "timeout"
    assert took < REDIS_BOUND_S
    assert store.get_blob(hexkey("big"), size=len(data)) == data


# -- a paused server (CLIENT PAUSE) --------------------------------------------


def test_paused_server_times_out_and_recovers(redis_server, make_store):
    breaker = Breaker(FAST)
    store = make_store(redis_server.url, breaker=breaker)
    store.publish_manifest(K, hexkey("d"), b"m")
    redis_server.admin().execute_command("CLIENT", "PAUSE", 600, "ALL")
    paused_at = time.monotonic()
    for _ in range(3):
        reason, took = timed(lambda: store.index(K))
        assert reason == "timeout" and took < REDIS_BOUND_S
    assert breaker.state == "open"
    assert timed(lambda: store.index(K))[0] == "circuit_open"
    wait_until(lambda: time.monotonic() > paused_at + 0.7)
    assert dict(store.index(K)) == {hexkey("d"): b"m"}
    assert breaker.state == "closed"


# -- the server killed mid-transfer --------------------------------------------


def test_server_killed_mid_transfer_is_an_error_bounded_in_time(private_valkey, make_store):
    data = os.urandom(32 << 20)
    private_valkey.admin().set(f"sj:v1:t1:cas:{hexkey('big')}", b"\x00" + data)
    killed = threading.Event()

    def kill_after_first_megabyte(total: int) -> None:
        if total >= 1 << 20 and not killed.is_set():
            killed.set()
            os.kill(private_valkey.pid, signal.SIGKILL)

    proxy = Proxy(private_valkey.port, on_bytes=kill_after_first_megabyte)
    try:
        store = make_store(f"redis://127.0.0.1:{proxy.port}/0")
        reason, took = timed(lambda: store.get_blob(hexkey("big"), size=len(data)))
    finally:
        proxy.close()
    assert killed.is_set()
    assert 1 << 20 <= proxy.downstream < len(data)
    assert reason == "error"
    assert took < 2.5  # the deadline of a 32 MB transfer is 0.17 s (its pool waits 0.2 s per read)
    private_valkey.proc.wait(5)
    direct = make_store(private_valkey.url)
    assert timed(lambda: direct.index(K))[0] == "refused"  # and nobody is there any more


def test_s3_connection_cut_mid_transfer_is_an_error(s3_url, make_store):
    data = os.urandom(8 << 20)
    make_store(s3_url).put_blob(hexkey("big"), data)
    endpoint_port = int(s3_url.split("endpoint=http://127.0.0.1:")[1].split("&")[0])
    proxy = Proxy(endpoint_port)
    proxy.on_bytes = lambda total: proxy.cut() if total >= 1 << 20 else None
    try:
        store = make_store(s3_url.replace(f":{endpoint_port}", f":{proxy.port}"))
        reason, took = timed(lambda: store.get_blob(hexkey("big"), size=len(data)))
    finally:
        proxy.close()
    assert reason == "error"
    assert took < 3.0


def test_s3_hung_then_back_recovers_through_the_probe(s3_url, make_store):
    endpoint_port = int(s3_url.split("endpoint=http://127.0.0.1:")[1].split("&")[0])
    proxy = Proxy(endpoint_port)
    try:
        breaker = Breaker(FAST)
        store = make_store(s3_url.replace(f":{endpoint_port}", f":{proxy.port}"), timeout_s=0.1, breaker=breaker)
        store.publish_manifest(K, hexkey("d"), b"m")
        proxy.paused = True
        for _ in range(3):
            reason, took = timed(lambda: store.index(K))
            assert reason == "timeout" and took < S3_BOUND_S
        assert breaker.state == "open"
        proxy.paused = False
        time.sleep(FAST.probe_interval_s)
        assert dict(store.index(K)) == {hexkey("d"): b"m"}
        assert breaker.state == "closed"
    finally:
        proxy.close()


# -- fault points ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "action", "call", "reason"),
    [
        ("remote.get", "raise:ETIMEDOUT", lambda s: s.index(K), "timeout"),
        ("remote.get", "raise:ECONNREFUSED", lambda s: s.has_blob(K), "refused"),
        ("remote.put", "raise:EIO", lambda s: s.put_blob(K, b"x"), "error"),
        ("remote.put", "raise:ETIMEDOUT", lambda s: s.publish_manifest(K, K, b"m"), "timeout"),
        ("remote.lease", "raise:ECONNREFUSED", lambda s: s.acquire_lease(K), "refused"),
        ("remote.connect", "raise:ECONNREFUSED", lambda s: s.index(K), "refused"),
        ("remote.connect", "raise:ETIMEDOUT", lambda s: s.get_blob(K), "timeout"),
    ],
)
def test_fault_points_end_as_reasons(engine_url, make_store, point, action, call, reason):
    store = make_store(engine_url)
    with faults.inject(point, action):
        assert timed(lambda: call(store))[0] == reason
    call(store)  # and the next call, without the fault, works


def test_corrupt_fault_damages_the_blob_read(engine_url, make_store):
    store = make_store(engine_url)
    store.put_blob(K, b"artifact")
    with faults.inject("remote.get", "corrupt"):
        assert timed(lambda: store.get_blob(K))[0] == "corrupt"
    assert store.get_blob(K) == b"artifact"


def test_delay_fault_is_not_cut_short(engine_url, make_store):
    store = make_store(engine_url)
    start = time.perf_counter()
    with faults.inject("remote.get", "delay:0.1"):
        assert dict(store.index(K)) == {}
    assert time.perf_counter() - start >= 0.1


def test_the_probe_admits_a_whole_operation(engine_url, make_store):
    breaker = Breaker(FAST)
    store = make_store(engine_url, breaker=breaker)
    with faults.inject("remote.get", "raise:ETIMEDOUT"):
        for _ in range(3):
            assert timed(lambda: store.has_blob(K))[0] == "timeout"
    assert breaker.state == "open"
    time.sleep(FAST.probe_interval_s)
    # put_blob of a large value makes two requests (exists?, then the write): both go through.
    assert store.put_blob(K, os.urandom(100_000)).value == "created"
    assert breaker.state == "closed"


def test_remote_error_pickles_and_reads_well():
    import pickle

    err = RemoteError("timeout", "index", "TimeoutError: Timeout reading from socket", engine="redis")
    assert str(err) == "remote redis index: timeout (TimeoutError: Timeout reading from socket)"
    again = pickle.loads(pickle.dumps(err))
    assert (again.reason, again.op, again.detail, again.engine) == ("timeout", "index", err.detail, "redis")
    assert str(RemoteError("circuit_open", "get_blob")) == "remote get_blob: circuit_open"
    with pytest.raises(ValueError):
        RemoteError("bogus", "index")  # type: ignore[arg-type]
