"""The hot reads' connections (``_lane.Lane``) on a real Valkey: kept, one connection serving
index and blob read after read, apart from the client's pool (its own commands never take
a kept one); one the server closed, one left with a reply unread, one that read an error
are never used again; a forked child makes its own; a closed store closes them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

import safejit
from safejit.cache.remote import RemoteError
from safejit.closure.hashing import digest_bytes

from ._servers import Scripted
from .conftest import FLEET_KEY, hexkey

K = hexkey("build")
D = hexkey("deps")
BLOB = hexkey("blob")


def connections(server) -> int:
    """Connections the server has accepted so far (the admin's own included)."""
    return int(server.admin().info("stats")["total_connections_received"])


@pytest.fixture
def store(redis_server, make_store):
    store = make_store(redis_server.url)
    store.publish_manifest(K, D, b'{"m": 1}')
    store.put_blob(BLOB, b"artifact bytes")
    return store


def test_index_and_blob_reads_keep_their_connections(redis_server, store):
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    before = connections(redis_server)
    for _ in range(5):
        assert dict(store.index(K)) == {D: b'{"m": 1}'}
        assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    assert connections(redis_server) == before + 1  # (the admin's, asking)


def test_the_clients_own_commands_never_take_a_kept_connection(redis_server, store):
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    before = connections(redis_server)
    for _ in range(3):
        assert store.client(15).get(store.layout.redis_cas(BLOB)) == b"\x00artifact bytes"
        assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    assert connections(redis_server) == before + 2  # the pool's one (and the admin's, asking)


def test_a_kept_connection_the_server_closed_is_replaced(redis_server, store):
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    redis_server.admin().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"


def test_a_connection_with_a_reply_left_unread_is_not_kept(redis_server, store):
    store.index(K)
    store.start_blob(BLOB, size=14).cancel()  # (its replies unread)
    before = connections(redis_server)
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    assert connections(redis_server) == before + 2  # a new one for the blob read (and the admin's)


def test_an_error_reply_drops_the_connection_and_the_next_read_is_its_own(redis_server, store):
    redis_server.admin().set(store.layout.redis_idx(hexkey("not a hash")), b"a string")
    with pytest.raises(RemoteError) as info:
        store.index(hexkey("not a hash"))
    assert info.value.reason == "corrupt" and "WRONGTYPE" in str(info.value)
    assert dict(store.index(K)) == {D: b'{"m": 1}'}


def test_a_forked_child_reads_on_its_own_connection(redis_server, store):
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    before = connections(redis_server)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        ok = dict(store.index(K)) == {D: b'{"m": 1}'}
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert connections(redis_server) == before + 2  # the child's (and the admin's)
    assert dict(store.index(K)) == {D: b'{"m": 1}'}  # the parent's still carries its own replies


def test_a_closed_store_closes_its_kept_connections(redis_server, store):
    admin = redis_server.admin()
    store.index(K)
    store.get_blob(BLOB, size=14)

    def clients() -> int:
        return int(admin.info("clients")["connected_clients"])

    before = clients()
    store.close()
    deadline = time.monotonic() + 10.0  # (a loaded machine)
    while clients() > before - 1 and time.monotonic() < deadline:  # (the server sees it go)
        time.sleep(0.01)
    assert clients() == before - 1  # the one the writes used, kept by the reads since
    with pytest.raises(RemoteError, match="closed"):  # (a closed store connects to nothing again)
        store.index(K)
    assert clients() == before - 1


def test_a_head_read_behind_the_index_keeps_the_connection_read_or_cancelled(redis_server, store):
    """The index and the head go out in one write; the head's replies are read off the same
    connection, or, cancelled, read to their end and dropped: either way it is kept, and
    lookups of a build key with no head, with a head read, a head cancelled unread (a
    large one) all run on the one connection."""
    head = bytes(range(256)) * 2048  # (512 KiB: more than one recv)
    assert store.put_head(K, digest_bytes(head), head).value == "created"
    index, pending = store.index_and_head(hexkey("absent"))
    assert dict(index) == {} and pending is not None and pending.result() is None
    before = connections(redis_server)
    for _ in range(3):
        index, pending = store.index_and_head(K)
        assert dict(index) == {D: b'{"m": 1}'} and bytes(pending.result()) == head
        index, pending = store.index_and_head(K)
        pending.cancel()
        pending.cancel()  # (a second call does nothing)
        index, pending = store.index_and_head(hexkey("absent"))
        pending.cancel()
        assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"
    assert connections(redis_server) == before + 1  # (the admin's, asking)


def test_a_head_over_its_cap_or_of_another_type_drops_its_connection_not_the_next_read(redis_server, store):
    key = store.layout.redis_head(K)
    admin = redis_server.admin()
    admin.set(key, bytes(32) + b"\x00" + b"x" * (store.settings.head_max_bytes + 10))  # (a digest, raw)
    _, pending = store.index_and_head(K)
    with pytest.raises(RemoteError) as oversize:
        pending.result()
    assert oversize.value.reason == "oversize"
    admin.delete(key)
    admin.hset(key, "a", "b")
    _, pending = store.index_and_head(K)
    with pytest.raises(RemoteError) as wrong:
        pending.result()
    assert wrong.value.reason == "corrupt"
    _, pending = store.index_and_head(K)
    pending.cancel()  # (an error reply: the connection is dropped, never kept)
    assert dict(store.index(K)) == {D: b'{"m": 1}'}
    assert store.breaker.state == "closed"  # (neither is the remote failing)


def test_heads_off_reads_the_index_alone(redis_server, make_store):
    store = make_store(redis_server.url, head_max_bytes=0)
    store.publish_manifest(K, D, b'{"m": 1}')
    index, pending = store.index_and_head(K)
    assert dict(index) == {D: b'{"m": 1}'} and pending is None


def test_a_head_cancel_interrupted_while_reading_drops_its_connection(redis_server, store, monkeypatch):
    """A KeyboardInterrupt while a cancelled head was read to its end left its connection
    taken from the pool for good, its reply half read: neither kept nor closed."""
    from safejit.cache.remote import _resp

    head = bytes(range(256)) * 64
    store.put_head(K, digest_bytes(head), head)
    _, pending = store.index_and_head(K)
    real = _resp.Replies.bulk

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_resp.Replies, "bulk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pending.cancel()
    monkeypatch.setattr(_resp.Replies, "bulk", real)
    client = store.client(len(head) + 1)
    pool = client.connection_pool
    assert not pool._in_use_connections  # (dropped: given back to the pool closed)
    clients = [c for c in redis_server.admin().client_list() if c.get("cmd") != "client|list"]
    assert all(c.get("cmd") != "getrange" for c in clients)  # (no connection left behind mid-read)
    assert bytes(store.get_blob(BLOB, size=14)) == b"artifact bytes"


def test_a_lease_key_of_any_size_is_read_no_further_than_a_token(redis_server, store):
    """The lease holder was read with redis-py's GET: a lease key anyone who may write set
    to 20 MiB was read whole, and decoded, on every poll of every waiting node."""
    admin = redis_server.admin()
    key = store.layout.redis_lease(K)
    admin.set(key, b"h" * (20 << 20))
    store.lease_holder(K)  # (the lane's connection made)
    sent = int(admin.info("stats")["total_net_output_bytes"])
    for _ in range(3):
        assert store.lease_holder(K) == "h" * 1024
    assert int(admin.info("stats")["total_net_output_bytes"]) - sent < 64 << 10
    admin.delete(key)
    assert store.lease_holder(K) is None


@contextlib.contextmanager
def _dripping(first: bytes, then: bytes) -> Iterator[int]:
    """A listener on a free loopback port (yielded) whose every connection, once it has
    received something, is sent ``first`` and then ``then`` every 20 ms, for good."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                conn, _ = listener.accept()
                threading.Thread(target=drip, args=(conn,), daemon=True).start()

    def drip(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(first)
            while not stop.wait(0.02):
                conn.sendall(then)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def test_a_lease_holder_reply_sent_a_byte_at_a_time_ends_at_its_deadline(make_store):
    """Through redis-py only each wait was bounded: a reply a byte every 20 ms held a lease
    wait's poll as long as the reply was long (20 s for these 1,000 bytes)."""
    with _dripping(b"$1000\r\n", b"x") as port:
        store = make_store(f"redis://127.0.0.1:{port}/0")
        started = time.monotonic()
        with pytest.raises(RemoteError) as info:
            store.lease_holder(K)
        assert info.value.reason == "timeout"
        assert time.monotonic() - started < 5  # (1000 bytes at 50 a second: 20 s without a whole-reply deadline)


@pytest.mark.parametrize("held", [b"AUTH", b"SET"])
def test_a_handshake_or_lease_reply_sent_a_byte_at_a_time_ends_at_its_deadline(make_store, held):
    """What redis-py reads itself was bounded only wait by wait: a server (or a proxy)
    answering AUTH as a connection opens, or a lease's SET, with a byte every 20 ms held
    the compile that asked for good. Each ends within a few waits, as a failure the
    breaker counts."""
    server = Scripted({b"HELLO": b"-ERR unknown command\r\n"}, trickle=frozenset({held}))
    url = server.url.replace("redis://", "redis://u:pw@") if held == b"AUTH" else server.url
    store = make_store(url)
    started = time.monotonic()
    try:
        with pytest.raises(RemoteError):
            store.acquire_lease(K)
        assert time.monotonic() - started < 5  # (for good, before)
    finally:
        server.close()


def test_a_compile_beside_a_server_that_trickles_its_handshake_compiles(tmp_path, project):
    """No exception, and no wait past the deadlines: the remote is a miss."""
    server = Scripted({}, trickle=frozenset({b"AUTH"}))
    cfg = safejit.Config(
        backend="fake",
        cache_dirs=(str(tmp_path / "disk"),),
        source_roots=(str(project),),
        remote=server.url.replace("redis://", "redis://u:pw@"),
        signing_key=FLEET_KEY,
    )
    started = time.monotonic()
    try:
        with safejit.Runtime(config=cfg) as rt:
            mod = rt.compile(safejit.Source('#include "inner.h"\n', "k"), include_dirs=(str(project / "include"),))
            assert mod.kernel("INNER")() == 41 and mod.artifact.tier == "compiled"
        assert time.monotonic() - started < 10
    finally:
        server.close()


def test_a_tls_handshake_sent_a_byte_at_a_time_ends_at_its_deadline(make_store):
    """Over TLS the handshake is made before redis-py holds the socket (out of the
    watchdog's reach): a server that begins a TLS record and sends the rest of it a byte
    every 20 ms is bounded all the same, by the connect timeout, which the ssl module
    takes as the whole handshake's deadline. (A regression guard: no wait here for it.)"""
    with _dripping(b"\x16\x03\x03\x40\x00", b"\x00") as port:  # (a 16 KiB handshake record, begun)
        store = make_store(f"rediss://127.0.0.1:{port}/0")
        started = time.monotonic()
        with pytest.raises(RemoteError):
            store.acquire_lease(K)
        assert time.monotonic() - started < 5  # (5.5 minutes for the record, were it not)
