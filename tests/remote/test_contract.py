"""The RemoteStore contract, run against both engines on real servers: write-once
(the second writer sees EXISTS), the index round trip and its cap, size caps that
are enforced without reading the whole value, and lease ownership."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

import safejit
from safejit.cache.remote import Lease, Put, RemoteError
from safejit.cache.remote.codec import RAW, ZSTD
from safejit.closure.hashing import digest_bytes

from ._servers import BUCKET
from .conftest import hexkey

K = hexkey("build")
D1, D2, D3, D4 = (hexkey(f"deps{i}") for i in range(4))


def _calls(ops: list[tuple]):
    def observer(op, seconds, reason, sent, received):
        ops.append((op, reason, sent, received))

    return observer


def test_index_of_an_unknown_build_key_is_empty(engine_url, make_store):
    assert dict(make_store(engine_url).index(K)) == {}


def test_manifest_round_trip_and_second_writer_sees_exists(engine_url, make_store):
    store = make_store(engine_url)
    assert store.publish_manifest(K, D1, b'{"first": 1}') is Put.CREATED
    assert store.publish_manifest(K, D1, b'{"second": 2}') is Put.EXISTS
    assert store.publish_manifest(K, D2, b'{"other": 3}') is Put.CREATED
    assert dict(store.index(K)) == {D1: b'{"first": 1}', D2: b'{"other": 3}'}


def test_index_is_capped_per_build_key(engine_url, make_store):
    store = make_store(engine_url, index_cap=2)
    assert store.publish_manifest(K, D1, b"1") is Put.CREATED
    assert store.publish_manifest(K, D2, b"2") is Put.CREATED
    assert store.publish_manifest(K, D3, b"3") is Put.FULL
    assert store.publish_manifest(K, D1, b"again") is Put.EXISTS
    assert set(store.index(K)) == {D1, D2}


def test_oversize_manifest_is_refused_before_sending(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, max_manifest_bytes=100, observer=_calls(ops))
    with pytest.raises(RemoteError) as info:
        store.publish_manifest(K, D1, b"x" * 101)
    assert info.value.reason == "oversize"
    assert ops == []
    assert dict(store.index(K)) == {}


def test_an_index_entry_over_the_manifest_limit_is_never_read(engine_url, make_store):
    """S3 lists sizes first: such an entry is left out. Redis sends the entries in one reply:
    the read stops at the one over the limit, the index is oversize (a miss)."""
    make_store(engine_url).publish_manifest(K, D1, b"y" * 200)
    make_store(engine_url).publish_manifest(K, D2, b"small")
    store = make_store(engine_url, max_manifest_bytes=100)
    if store.engine == "s3":
        assert dict(store.index(K)) == {D2: b"small"}
        return
    with pytest.raises(RemoteError) as info:
        store.index(K)
    assert info.value.reason == "oversize"
    assert store.breaker.state == "closed"  # (stored data, from a server that is up)
    assert dict(make_store(engine_url).index(K)) == {D1: b"y" * 200, D2: b"small"}


def test_index_is_per_tenant_and_backend(engine_url, make_store):
    make_store(engine_url).publish_manifest(K, D1, b"m")
    assert dict(make_store(engine_url, tenant="t2").index(K)) == {}
    assert dict(make_store(engine_url, backend="host").index(K)) == {}


@pytest.mark.parametrize("size", [0, 1, 1000, 200_000])
def test_blob_round_trip(engine_url, make_store, size):
    store = make_store(engine_url)
    data = (b"cubin-like " * (size // 11 + 1))[:size]
    digest = hexkey(f"blob{size}")
    assert store.has_blob(digest) is False
    assert store.get_blob(digest) is None
    assert store.put_blob(digest, data) is Put.CREATED
    assert store.has_blob(digest) is True
    got = store.get_blob(digest)
    assert isinstance(got, memoryview) and got.readonly
    assert bytes(got) == data
    assert store.get_blob(digest, size=size) == data


def test_blob_is_write_once(engine_url, make_store):
    store = make_store(engine_url)
    digest = hexkey("once")
    assert store.put_blob(digest, b"first") is Put.CREATED
    assert store.put_blob(digest, b"second") is Put.EXISTS
    assert store.get_blob(digest) == b"first"


def test_a_started_blob_read_returns_what_get_blob_does(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, observer=_calls(ops))
    digest, data = hexkey("started"), os.urandom(300_000)
    store.put_blob(digest, data)
    ops.clear()
    pending = store.start_blob(digest, size=len(data))
    other = store.index(K)  # another operation while the reply is under way
    got = pending.result()
    assert dict(other) == {} and isinstance(got, memoryview) and got.readonly and got == data
    assert [(op, reason, received) for op, reason, _, received in ops] == [
        ("index", None, 0),
        ("get_blob", None, 300_001),
    ]
    assert store.start_blob(hexkey("absent")).result() is None


@pytest.mark.parametrize("compressible", [False, True], ids=["raw", "zstd"])
def test_a_started_blob_reads_digest_is_that_of_what_it_returned(engine_url, make_store, compressible):
    """An engine that hashes a value as it is received (Redis: a raw one, piece by piece)
    gives the BLAKE3 of exactly the bytes result() returned; otherwise None, never
    another value's (a compressed value's stored bytes are not the artifact)."""
    store = make_store(engine_url)
    data = b"abc" * 400_000 if compressible else os.urandom(1_200_000)  # (several recv pieces)
    digest = digest_bytes(data)
    store.put_blob(digest, data)
    pending = store.start_blob(digest, size=len(data))
    assert pending.digest is None  # (nothing received yet)
    got = pending.result()
    assert got == data
    hashed_here = engine_url.startswith("redis") and not compressible
    assert pending.digest == (digest if hashed_here else None)


def test_a_cancelled_blob_read_is_dropped_unread_and_the_next_reply_is_its_own(engine_url, make_store):
    """The connection that carried a cancelled read is not handed to the next command (it
    would read the blob as its own reply)."""
    store = make_store(engine_url)
    digest, data = hexkey("dropped"), os.urandom(300_000)
    store.put_blob(digest, data)
    store.publish_manifest(K, D1, b"m")
    for _ in range(3):
        store.start_blob(digest, size=len(data)).cancel()
        assert dict(store.index(K)) == {D1: b"m"}
        assert store.get_blob(digest, size=len(data)) == data


def test_a_started_blob_read_over_the_cap_is_refused_before_asking(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, max_bytes=1000, observer=_calls(ops))
    with pytest.raises(RemoteError) as info:
        store.start_blob(hexkey("big"), size=1001)
    assert info.value.reason == "oversize" and ops == []


def test_concurrent_blob_writers_exactly_one_creates(engine_url, make_store):
    store = make_store(engine_url)
    digest = hexkey("race")
    results: list[Put] = []
    barrier = threading.Barrier(6)

    def put(i: int) -> None:
        barrier.wait()
        results.append(store.put_blob(digest, f"writer {i}".encode()))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.value for r in results) == ["created"] + ["exists"] * 5
    assert store.get_blob(digest) in {f"writer {i}".encode() for i in range(6)}


def test_large_blob_that_exists_is_not_sent_again(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, observer=_calls(ops))
    digest = hexkey("large")
    data = os.urandom(300_000)
    assert store.put_blob(digest, data) is Put.CREATED
    ops.clear()
    assert store.put_blob(digest, data) is Put.EXISTS
    assert [op for op, *_ in ops] == ["has_blob"]
    assert sum(sent for *_, sent, _ in ops) == 0


def test_compressible_blob_is_stored_zstd_and_small_one_raw(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, observer=_calls(ops))
    big = b"\x00\x01\x02\x03" * 50_000
    assert store.put_blob(hexkey("big"), big) is Put.CREATED
    assert store.put_blob(hexkey("small"), b"\x00\x01" * 1000) is Put.CREATED
    sent = [s for op, _, s, _ in ops if op == "put_blob"]
    assert sent[0] < len(big) // 10
    assert sent[1] == 2001
    assert store.get_blob(hexkey("big")) == big


def test_blob_over_the_callers_size_is_oversize(engine_url, make_store):
    store = make_store(engine_url)
    digest = hexkey("sized")
    store.put_blob(digest, b"z" * 1000)
    assert store.get_blob(digest, size=1000) == b"z" * 1000
    with pytest.raises(RemoteError) as info:
        store.get_blob(digest, size=999)
    assert info.value.reason == "oversize"


def test_blob_over_max_bytes_is_never_read_whole(engine_url, make_store):
    ops: list[tuple] = []
    make_store(engine_url).put_blob(hexkey("huge"), os.urandom(1 << 20))
    store = make_store(engine_url, max_bytes=4096, observer=_calls(ops))
    with pytest.raises(RemoteError) as info:
        store.get_blob(hexkey("huge"))
    assert info.value.reason == "oversize"
    assert [(op, received) for op, _, _, received in ops] == [("get_blob", 4096 + 2)]


def test_size_over_max_bytes_is_refused_without_a_request(engine_url, make_store):
    ops: list[tuple] = []
    store = make_store(engine_url, max_bytes=4096, observer=_calls(ops))
    with pytest.raises(RemoteError) as info:
        store.get_blob(hexkey("x"), size=4097)
    assert info.value.reason == "oversize"
    with pytest.raises(RemoteError) as info:
        store.put_blob(hexkey("x"), b"x" * 4097)
    assert info.value.reason == "oversize"
    assert ops == []


def test_compressed_blob_decompressing_past_the_size_is_oversize(engine_url, make_store):
    store = make_store(engine_url)
    digest = hexkey("zeros")
    zeros = bytes(1 << 20)
    store.put_blob(digest, zeros)
    with pytest.raises(RemoteError) as info:
        store.get_blob(digest, size=(1 << 20) - 1)
    assert info.value.reason == "oversize"
    assert store.get_blob(digest, size=1 << 20) == zeros


def test_malformed_keys_are_refused(engine_url, make_store):
    store = make_store(engine_url)
    for bad in ("", "ABC", "g" * 64, "a" * 63, "a" * 64 + "*", "a" * 32 + ":" + "a" * 31):
        with pytest.raises(ValueError):
            store.index(bad)
        with pytest.raises(ValueError):
            store.get_blob(bad)
    with pytest.raises(ValueError):
        store.publish_manifest(K, "../" + "a" * 61, b"m")


# -- leases -------------------------------------------------------------------


def test_lease_has_one_owner(engine_url, make_store):
    a, b = make_store(engine_url), make_store(engine_url)
    lease = a.acquire_lease(K, holder="node-a")
    assert isinstance(lease, Lease)
    assert lease.token.startswith("node-a:")
    assert b.acquire_lease(K, holder="node-b") is None
    assert a.acquire_lease(K, holder="node-a") is None  # a second holding by the same node is refused too
    assert b.lease_holder(K) == lease.token


def test_lease_renew_and_release_only_by_the_owner(engine_url, make_store):
    store = make_store(engine_url)
    lease = store.acquire_lease(K, ttl_s=30)
    assert lease is not None
    thief = Lease(K, "node-b:" + "0" * 32, 30)
    assert store.renew_lease(thief) is False
    assert store.release_lease(thief) is False
    assert store.lease_holder(K) == lease.token
    assert store.renew_lease(lease) is True
    assert store.release_lease(lease) is True
    assert store.lease_holder(K) is None
    assert store.release_lease(lease) is False
    again = store.acquire_lease(K)
    assert again is not None and again.token != lease.token


def test_expired_lease_is_taken_over_by_exactly_one(engine_url, make_store):
    stores = [make_store(engine_url) for _ in range(6)]
    first = stores[0].acquire_lease(K, holder="dead", ttl_s=0.3)
    assert first is not None
    time.sleep(0.5)
    assert stores[0].lease_holder(K) is None
    won: list[Lease] = []
    barrier = threading.Barrier(len(stores))

    def take(store) -> None:
        barrier.wait()
        got = store.acquire_lease(K, holder="taker", ttl_s=30)
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=take, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert stores[0].lease_holder(K) == won[0].token
    assert stores[0].renew_lease(first) is False  # the dead holder lost it
    assert stores[0].release_lease(first) is False
    assert stores[0].lease_holder(K) == won[0].token


def test_renewed_lease_outlives_its_first_ttl(engine_url, make_store):
    store = make_store(engine_url)
    lease = store.acquire_lease(K, ttl_s=0.6)
    assert lease is not None
    for _ in range(3):
        time.sleep(0.25)
        assert store.renew_lease(lease) is True
    assert store.lease_holder(K) == lease.token  # 0.75 s after acquiring, past the first TTL


def test_stored_values_carry_the_codec_byte(redis_server, make_store):
    store = make_store(redis_server.url)
    store.put_blob(hexkey("raw"), b"abc")
    store.put_blob(hexkey("zstd"), b"a" * 100_000)
    admin = redis_server.admin()
    assert admin.get(f"sj:v1:t1:cas:{hexkey('raw')}") == bytes([RAW]) + b"abc"
    assert admin.get(f"sj:v1:t1:cas:{hexkey('zstd')}")[0] == ZSTD
    assert sorted(k.decode() for k in admin.keys("*")) == sorted(
        [f"sj:v1:t1:cas:{hexkey('raw')}", f"sj:v1:t1:cas:{hexkey('zstd')}"]
    )


def test_s3_object_keys_mirror_the_redis_layout(s3_url, s3_client, make_store):
    store = make_store(s3_url)
    store.put_blob(hexkey("b"), b"abc")
    store.publish_manifest(K, D1, b"m")
    store.acquire_lease(K)
    prefix = s3_url.split("/")[3].split("?")[0]
    listed = s3_client.list_objects_v2(Bucket="sj-remote-tests", Prefix=prefix + "/")
    keys = sorted(o["Key"][len(prefix) + 1 :] for o in listed["Contents"])
    assert keys == sorted(
        [
            f"v1/t1/cas/{hexkey('b')[:2]}/{hexkey('b')}",
            f"v1/t1/cuda/idx/{K}/{D1}.json",
            f"v1/t1/cuda/lease/{K}",
        ]
    )


def _in_forked_child(fn) -> str:
    """Run ``fn()`` in a forked child; what it returned or the reason it raised."""
    import warnings

    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        signal.alarm(10)  # a hang ends the child, and the test fails on its status
        try:
            out = repr(fn())
        except RemoteError as exc:
            out = f"RemoteError:{exc.reason}"
        except BaseException as exc:
            out = f"{type(exc).__name__}:{exc}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0, (status, out)
    return out


def test_redis_store_used_before_fork_works_in_the_child(redis_server, make_store):
    store = make_store(redis_server.url)
    store.publish_manifest(K, D1, b"m")
    assert _in_forked_child(lambda: dict(store.index(K))) == repr({D1: b"m"})


def test_s3_store_used_before_fork_fails_fast_in_the_child(s3_url, make_store):
    store = make_store(s3_url)
    store.publish_manifest(K, D1, b"m")
    fresh = make_store(s3_url)
    start = time.monotonic()
    assert _in_forked_child(lambda: dict(fresh.index(K))) == "RemoteError:error"
    assert time.monotonic() - start < 5  # not the hang of obstore's runtime in a forked child


def test_planted_empty_or_garbage_blob_is_corrupt_not_an_outage(engine_url, make_store, request):
    store = make_store(engine_url)
    empty, garbage = hexkey("empty"), hexkey("garbage")
    if engine_url.startswith("redis"):
        admin = request.getfixturevalue("redis_server").admin()
        admin.set(f"sj:v1:t1:cas:{garbage}", b"\x09garbage")
        admin.set(f"sj:v1:t1:cas:{empty}", b"")  # GETRANGE cannot tell it from absent: a miss
        assert store.get_blob(empty) is None
    else:
        client = request.getfixturevalue("s3_client")
        prefix = engine_url.split("/")[3].split("?")[0]
        client.put_object(Bucket="sj-remote-tests", Key=f"{prefix}/v1/t1/cas/{empty[:2]}/{empty}", Body=b"")
        client.put_object(Bucket="sj-remote-tests", Key=f"{prefix}/v1/t1/cas/{garbage[:2]}/{garbage}", Body=b"\x09g")
        with pytest.raises(RemoteError) as info:
            store.get_blob(empty)
        assert info.value.reason == "corrupt"
    with pytest.raises(RemoteError) as info:
        store.get_blob(garbage)
    assert info.value.reason == "corrupt"
    assert store.breaker.state == "closed"  # type: ignore[attr-defined]


def test_s3_conditional_write_conflict_is_retried_once(s3_url, make_store):
    import types

    import obstore
    from obstore.exceptions import GenericError

    store = make_store(s3_url)
    calls: list[str] = []

    def put(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 1:
            raise GenericError("Server returned non-2xx status code: 409 Conflict: ConditionalRequestConflict")
        return obstore.put(*args, **kwargs)

    store._obstore = types.SimpleNamespace(**{n: getattr(obstore, n) for n in ("get", "head", "list")}, put=put)
    assert store.put_blob(hexkey("c"), b"data") is Put.CREATED
    assert len(calls) == 2
    calls.clear()

    def always_conflict(*args, **kwargs):
        calls.append(args[1])
        raise GenericError("Server returned non-2xx status code: 409 Conflict: ConditionalRequestConflict")

    store._obstore.put = always_conflict
    with pytest.raises(RemoteError) as info:
        store.put_blob(hexkey("d"), b"data")
    assert info.value.reason == "error" and len(calls) == 2


def test_redis_keys_of_the_wrong_type_are_corrupt_and_the_next_command_gets_its_own_reply(redis_server, make_store):
    store = make_store(redis_server.url)
    admin = redis_server.admin()
    admin.set(f"sj:v1:t1:cuda:idx:{K}", b"not a hash")
    blob = hexkey("hash-blob")
    admin.hset(f"sj:v1:t1:cas:{blob}", "f", "v")
    for _ in range(2):
        with pytest.raises(RemoteError) as info:
            store.index(K)
        assert info.value.reason == "corrupt" and "WRONGTYPE" in str(info.value)
        with pytest.raises(RemoteError) as info:
            store.get_blob(blob)
        assert info.value.reason == "corrupt" and "WRONGTYPE" in str(info.value)
        store.publish_manifest(D1, D2, b"m")
        assert dict(store.index(D1)) == {D2: b"m"}
    # (a poisoned key is no failure of the remote: the breaker stays closed for the others)
    for _ in range(20):
        with pytest.raises(RemoteError):
            store.index(K)
    assert store.breaker.state == "closed"


def test_a_closed_store_makes_no_connection_again(engine_url, make_store):
    """After close(), every operation is a RemoteError ('error': a miss to the tier) and none
    reaches the server: a compile still running when its node closed used to open the
    pools again, and keep their connections for the life of the process."""
    ops: list[tuple] = []
    store = make_store(engine_url, observer=_calls(ops))
    digest = hexkey("closed")
    store.put_blob(digest, b"kept")
    store.close()
    store.close()  # (a second close does nothing)
    ops.clear()
    calls = {
        "index": lambda: store.index(K),
        "get_blob": lambda: store.get_blob(digest),
        "start_blob": lambda: store.start_blob(digest, size=4).result(),
        "has_blob": lambda: store.has_blob(digest),
        "put_blob": lambda: store.put_blob(hexkey("after"), b"late"),
        "publish_manifest": lambda: store.publish_manifest(K, D1, b"m"),
        "acquire_lease": lambda: store.acquire_lease(K),
    }
    for name, call in calls.items():
        with pytest.raises(RemoteError) as info:
            call()
        assert info.value.reason == "error" and "closed" in str(info.value), name
    assert ops == [] and store._pools == {}  # type: ignore[attr-defined]


def test_a_closed_store_still_lets_its_lease_go(engine_url, make_store):
    """Letting a lease go is the one thing a closed store still does (a compile that ended
    after its node closed), on a connection made for it alone: the other nodes take the
    key over at once instead of after the TTL, and the store keeps no client after it."""
    a, b = make_store(engine_url), make_store(engine_url)
    lease = a.acquire_lease(K, holder="a", ttl_s=30)
    assert lease is not None
    a.close()
    with pytest.raises(RemoteError, match="closed"):
        a.renew_lease(lease)  # (renewing is not letting go)
    assert b.acquire_lease(K, holder="b", ttl_s=30) is None  # still held
    assert a.release_lease(lease) is True
    assert a._pools == {}  # type: ignore[attr-defined]
    assert b.acquire_lease(K, holder="b", ttl_s=30) is not None


def test_close_lets_a_lease_release_under_way_end_first(redis_server, make_store, monkeypatch):
    """A release already sent when close() is called (its reply held back here by a
    CLIENT PAUSE) ends before close() disconnects its client: cut off, its lease was left
    to expire, and the other nodes to wait out its TTL."""
    from safejit.cache.remote import redis as engine

    a, b = make_store(redis_server.url, timeout_s=2.0), make_store(redis_server.url)
    lease = a.acquire_lease(K, holder="a", ttl_s=30)
    assert lease is not None
    sent, real = threading.Event(), engine.SERVER_CODE["release"]

    def release(*args):
        sent.set()
        return real(*args)

    monkeypatch.setitem(engine.SERVER_CODE, "release", release)
    redis_server.admin().execute_command("CLIENT", "PAUSE", 300, "WRITE")
    released: list[bool] = []
    thread = threading.Thread(target=lambda: released.append(a.release_lease(lease)))
    thread.start()
    assert sent.wait(10)
    time.sleep(0.05)  # (sent, and held by the pause)
    a.close()
    thread.join(10)
    assert released == [True]
    assert b.acquire_lease(K, holder="b", ttl_s=30) is not None


def test_a_blob_read_that_finds_no_lane_is_a_remote_error(redis_server, make_store):
    """A read that got past admit as close() ran may find its client pooled but no lane
    (close used to forget the lanes first): a RemoteError (a miss), never a KeyError out
    of the tier. Close now drops the pools first; after it, the same."""
    from safejit.cache.remote._pending import PendingGet

    store = make_store(str(redis_server.url))
    store.index(K)  # (a client and its lanes exist)
    store._lanes = {}  # type: ignore[attr-defined]  # (close's old first step, the pools still there)
    with pytest.raises(RemoteError):
        PendingGet(store, "k", 10)
    store.close()
    with pytest.raises(RemoteError, match="closed"):
        PendingGet(store, "k", 10)


@pytest.mark.parametrize("expires", ["1" + "0" * 400, "null", '"soon"'])
def test_an_s3_lease_that_cannot_be_read_is_taken_over(s3_url, s3_client, make_store, expires):
    """A lease body is read as expired when it cannot be read; an expiry too large for a
    float raised OverflowError instead, an error on every look, and the lease was never
    taken over (S3 deletes nothing)."""
    prefix = s3_url.split("/")[3].split("?")[0]
    body = f'{{"token": "x", "expires": {expires}}}'.encode()
    s3_client.put_object(Bucket="sj-remote-tests", Key=f"{prefix}/v1/t1/cuda/lease/{K}", Body=body)
    store = make_store(s3_url)
    lease = store.acquire_lease(K)
    assert lease is not None and store.lease_holder(K) == lease.token


def test_s3_objects_under_an_index_that_are_no_leaves_neither_hide_its_leaves_nor_fill_it(
    s3_url, s3_client, make_store
):
    """A writer's create-only PUTs may put anything under ``idx/<K>/``: those objects are no
    leaves (not ``<deps key>.json``), so they are passed over, never counted against the cap;
    and an index's listing is read a bounded number of pages (never the whole prefix)."""
    store = make_store(s3_url)
    assert store.publish_manifest(K, D1, b"{}") is Put.CREATED
    prefix = s3_url.split("?")[0].split("/", 3)[3] + f"/v1/t1/cuda/idx/{K}/"
    for i in range(64):  # (they sort before the leaf)
        s3_client.put_object(Bucket=BUCKET, Key=f"{prefix}0{i:02d}", Body=b"")
    assert dict(store.index(K)) == {D1: b"{}"}
    assert store.publish_manifest(K, D2, b"{}") is Put.CREATED
    assert dict(store.index(K)) == {D1: b"{}", D2: b"{}"}


def test_an_s3_lease_nested_past_any_parser_is_an_expired_one(s3_url, s3_client, make_store):
    store = make_store(s3_url)
    prefix = s3_url.split("?")[0].split("/", 3)[3]
    s3_client.put_object(Bucket=BUCKET, Key=f"{prefix}/v1/t1/cuda/lease/{K}", Body=b"[" * 4000)
    assert store.lease_holder(K) is None  # (unreadable: taken for expired, not an error)
    assert store.acquire_lease(K, holder="me") is not None


def test_an_index_filled_by_the_publish_function_is_always_read_whole(redis_server, make_store):
    """The publish function lets in no more manifest bytes than a read takes (8 manifests'
    worth): an index it filled is readable, never oversize; one more leaf is FULL."""
    store = make_store(redis_server.url, max_manifest_bytes=1000)
    puts = [store.publish_manifest(K, hexkey(f"d{i}"), b"m" * 1000) for i in range(12)]
    created = puts.count(Put.CREATED)
    # (8,000 bytes of names and manifests: 7 leaves of 64 + 1,000 bytes, then FULL)
    assert created == 7 and puts[created:] == [Put.FULL] * (12 - created), puts
    assert len(store.index(K)) == created


def test_a_large_index_over_a_link_as_slow_as_bytes_per_s_says_is_read(redis_server, make_store):
    """An index read's whole-reply deadline is sized for the largest index a read takes at
    the link's bytes_per_s (it was the 50 ms of an empty one: a timeout, then the breaker).
    The link is 5x faster than the store is told (80 ms for these 4 MB; the deadline
    about 400): a loaded machine's delays fit, and 50 ms still would not."""
    from ._servers import Proxy

    writer = make_store(redis_server.url)
    for i in range(4):
        writer.publish_manifest(K, hexkey(f"big{i}"), b"m" * 1_000_000)
    proxy = Proxy(redis_server.port, rate=50e6)
    try:
        store = make_store(f"redis://127.0.0.1:{proxy.port}/0", bytes_per_s=10e6)
        for _ in range(4):
            assert len(store.index(K)) == 4
        assert store.breaker.state == "closed"
    finally:
        proxy.close()


def test_a_server_without_functions_runs_the_same_code_as_scripts(tmp_path, make_store):
    """Redis 6 or Dragonfly (here a Valkey with FCALL and FUNCTION renamed away): publishing
    and leases work as scripts, and nothing counts as the remote failing."""
    from ._servers import start_valkey

    server = start_valkey(tmp_path / "nofcall", "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
    try:
        store = make_store(server.url)
        for i in range(5):
            assert store.publish_manifest(K, hexkey(f"s{i}"), b"{}") is Put.CREATED
        lease = store.acquire_lease(K, holder="me")
        assert lease is not None and store.renew_lease(lease) and store.release_lease(lease)
        assert len(store.index(K)) == 5 and store.breaker.state == "closed"
    finally:
        server.stop()


def test_a_lease_is_renewed_and_let_go_on_a_server_at_maxmemory(redis_server, make_store):
    """Functions are refused whole at maxmemory unless flagged allow-oom: a node could no
    longer let its lease go, and the others waited on it."""
    store = make_store(redis_server.url)
    store.publish_manifest(hexkey("warm"), D1, b"{}")  # (the functions loaded)
    lease = store.acquire_lease(K, holder="me")
    assert lease is not None
    admin = redis_server.admin()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) + (1 << 20)))
    try:
        with pytest.raises(Exception, match="maxmemory"):
            for i in range(10_000):
                admin.set(f"filler:{i}", b"x" * 512)
        assert store.renew_lease(lease) is True
        assert store.release_lease(lease) is True
        assert store.lease_holder(K) is None
    finally:
        admin.config_set("maxmemory", "0")
        admin.delete(*[f"filler:{i}" for i in range(10_000)])


def test_the_publish_function_never_walks_an_index_past_its_hard_cap(redis_server, make_store):
    """Whatever cap the caller passes, the function refuses past 1,024 leaves before it walks
    the index: a writer that filled one with plain HSETNX (millions of fields) and asked for
    a cap of 10**12 held the server for seconds, every tenant's commands BUSY."""
    store = make_store(redis_server.url, index_cap=10**6)
    admin = redis_server.admin()
    index = store.layout.redis_idx(K)
    pipe = admin.pipeline(transaction=False)
    for i in range(1100):
        pipe.hsetnx(index, hexkey(f"filled{i}"), b"m")
    pipe.execute()
    assert store.publish_manifest(K, D1, b"{}") is Put.FULL  # (1,100 small ones: within every other cap)
    assert admin.hexists(index, D1) == 0


def test_the_functions_load_beside_those_of_another_release(redis_server, make_store):
    """A function's name holds a digest of its code: one of another release (an older body)
    stays loaded for its writers, and this release's load beside it."""
    from safejit.cache.remote.redis import FUNCTIONS

    admin = redis_server.admin()
    older = FUNCTIONS[0].replace("safejit_publish_", "safejit_publish_0ld").replace("1024", "2048")
    admin.function_load(older, replace=True)
    for library in FUNCTIONS:
        admin.function_load(library, replace=True)
    names = {dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode() for lib in admin.function_list()}
    assert len(names & {lib.split("name=", 1)[1].split("\n", 1)[0] for lib in FUNCTIONS}) == 3
    assert any(name.startswith("safejit_publish_0ld") for name in names)
    assert make_store(redis_server.url).publish_manifest(K, D1, b"{}") is Put.CREATED


def test_a_missing_bucket_is_said_so_not_taken_for_an_absent_object(moto, make_store, node, project, caplog):
    """S3 answers a missing bucket with a 404, as for a missing object: a read found
    nothing, and a write was "refused" (nobody listening). Each is an error that names the
    bucket; a compile goes on (a miss) and its failed upload is a warning."""
    url = f"s3://testing:testing@no-such-bucket/p?endpoint={moto.endpoint}&region=us-east-1"
    store = make_store(url)
    calls = {
        "ping": store.ping,  # (a HEAD's 404 could not tell: it has no body)
        "index": lambda: store.index(hexkey("k")),
        "get_blob": lambda: store.get_blob(hexkey("b")),
        "put_blob": lambda: store.put_blob(hexkey("b"), b"x"),
    }
    for op, call in calls.items():
        with pytest.raises(RemoteError) as info:
            call()
        assert info.value.reason == "error" and info.value.op == op, info.value
        assert info.value.detail == "the bucket 'no-such-bucket' does not exist (NoSuchBucket)"
    rt = node("a", remote=url)
    with caplog.at_level(logging.INFO, logger="safejit.cache.remote.uploads"):
        mod = rt.compile(safejit.Source('#include "inner.h"\n', "k"), include_dirs=(str(project / "include"),))
        (result,) = rt.flush_uploads().results
    assert mod.artifact.tier == "compiled" and result.reason == "error" and "NoSuchBucket" in result.detail
    (record,) = [r for r in caplog.records if "uploading" in r.getMessage()]
    assert record.levelno == logging.WARNING


def test_an_s3_index_is_read_within_its_byte_budget_and_published_no_further(s3_url, s3_client, make_store):
    """On S3 an index read had no byte budget (64 leaves of up to 1 MiB each read in full)
    and a publish let in any number of bytes: as on Redis, a publish stops at what a read
    takes, and an index filled past it another way is oversize, never read whole."""
    store = make_store(s3_url, max_manifest_bytes=1000)
    puts = [store.publish_manifest(K, hexkey(f"d{i}"), b"m" * 1000) for i in range(12)]
    created = puts.count(Put.CREATED)
    assert created == 8 and puts[created:] == [Put.FULL] * (12 - created), puts
    assert len(store.index(K)) == created
    prefix = s3_url.split("/")[3].split("?")[0]
    s3_client.put_object(Bucket=BUCKET, Key=f"{prefix}/v1/t1/cuda/idx/{K}/{hexkey('more')}.json", Body=b"m" * 1000)
    with pytest.raises(RemoteError) as info:
        store.index(K)
    assert info.value.reason == "oversize"


def test_an_s3_index_read_ends_at_one_deadline_for_all_its_requests(s3_url, moto, make_store):
    """Each request had a deadline of its own, the whole read none: an index of many
    leaves on a store answering each request slowly held a lookup for seconds."""
    from ._servers import Proxy

    writer = make_store(s3_url)
    for i in range(12):
        writer.publish_manifest(K, hexkey(f"slow{i}"), b"{}")
    proxy = Proxy(moto.port, delay=0.06)
    try:
        slow = s3_url.replace(moto.endpoint, f"http://127.0.0.1:{proxy.port}")
        store = make_store(slow, timeout_s=0.5, timeout_max_s=0.5)
        started = time.monotonic()
        with pytest.raises(RemoteError) as info:
            store.index(K)
        assert info.value.reason == "timeout" and "entries read in time" in str(info.value)
        assert time.monotonic() - started < 0.5 + 1.0  # (one request past the deadline at most)
    finally:
        proxy.close()
