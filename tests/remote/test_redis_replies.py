"""The blob and index reads' replies, read straight off the socket (``_resp.Replies``): what
a server may send — the value whole or in pieces, absent, an error, too much, garbage,
nothing, a closed connection — gives the value or the error redis-py's parser would have
raised; and the commands, packed as redis-py packs them (``_resp.pack``)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis

from safejit.cache.remote import RemoteError, _resp
from safejit.cache.remote._resp import Replies
from safejit.cache.remote.redis import classify

from ._servers import Scripted
from .conftest import hexkey

K, D = hexkey("k"), hexkey("d")


def _trickle(sock: socket.socket, wire: bytes, step: int) -> threading.Thread:
    """A writer sending ``wire`` in pieces of ``step`` bytes, a millisecond apart (started)."""

    def run() -> None:
        for i in range(0, len(wire), step):
            sock.sendall(wire[i : i + step])
            time.sleep(0.001)

    writer = threading.Thread(target=run)
    writer.start()
    return writer


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)
    yield ours, theirs
    ours.close()
    theirs.close()


def replies(sock: socket.socket) -> Replies:
    return Replies(redis, SimpleNamespace(_sock=sock))


def blob_read(sock: socket.socket, cap: int) -> tuple[bytes, bytes]:
    """What ``PendingGet`` reads: the codec byte, then up to ``cap + 1`` bytes."""
    got = replies(sock)
    return got.bulk(1, expect=1), got.bulk(cap + 1, expect=cap)


def test_a_value_there_whole_is_the_bytes_received(pair):
    ours, theirs = pair
    theirs.sendall(b"$1\r\n\x00\r\n$5\r\nhello\r\n")
    head, payload = blob_read(ours, 5)
    assert head == b"\x00" and type(payload) is bytes and payload == b"hello"
    theirs.sendall(b"+PONG\r\n")  # nothing past the replies was read
    assert ours.recv(100) == b"+PONG\r\n"


def test_a_value_in_pieces_is_read_whole(pair):
    ours, theirs = pair
    data = bytes(range(256)) * 400
    wire = b"$1\r\n\x01\r\n$%d\r\n%b\r\n" % (len(data), data)
    writer = _trickle(theirs, wire, 7000)
    head, payload = blob_read(ours, len(data))
    writer.join()
    assert head == b"\x01" and type(payload) is bytes and payload == data


def test_a_value_over_what_is_asked_for_at_once_comes_in_pieces(pair, monkeypatch):
    monkeypatch.setattr(_resp, "_AT_ONCE", 1000)
    monkeypatch.setattr(_resp, "_PIECE", 300)
    ours, theirs = pair
    data = bytes(range(256)) * 20
    theirs.sendall(b"$1\r\n\x00\r\n$%d\r\n%b\r\n+PONG\r\n" % (len(data), data))
    assert blob_read(ours, len(data)) == (b"\x00", data)
    assert ours.recv(100) == b"+PONG\r\n"  # nothing past the replies was read


def test_a_header_of_another_length_than_expected(pair):
    ours, theirs = pair
    theirs.sendall(b"$1\r\n\x01\r\n$3\r\nabc\r\n")  # (shorter than the 100000 asked for: zstd)
    assert blob_read(ours, 100_000) == (b"\x01", b"abc")
    theirs.sendall(b"$1\r\n\x00\r\n$11\r\nhello world\r\n")  # longer: over the cap of 9
    with pytest.raises(redis.exceptions.InvalidResponse):
        blob_read(ours, 9)


def test_one_byte_over_the_cap_is_read_for_the_caller_to_refuse(pair):
    ours, theirs = pair
    theirs.sendall(b"$1\r\n\x00\r\n$6\r\nhello!\r\n")
    assert blob_read(ours, 5) == (b"\x00", b"hello!")


def test_an_absent_value(pair):
    ours, theirs = pair
    theirs.sendall(b"$0\r\n\r\n$0\r\n\r\n")
    assert blob_read(ours, 1000) == (b"", b"")
    theirs.sendall(b"$-1\r\n$-1\r\n")
    assert blob_read(ours, 1000) == (b"", b"")


def test_an_error_reply_is_a_response_error_with_its_reason(pair):
    ours, theirs = pair
    theirs.sendall(b"-NOPERM User sj-t1-reader has no permissions to run the 'getrange' command\r\n")
    with pytest.raises(redis.exceptions.ResponseError) as info:
        blob_read(ours, 1000)
    assert classify(info.value) == "denied" and "getrange" in str(info.value)


@pytest.mark.parametrize(
    "wire",
    [
        b"+OK\r\n",
        b":5\r\n",
        b"$x1\r\n",
        b"$1\r\n\x00\r\n$-5\r\n",
        b"$1\r\n\x00\r\n$3\r\nabcXY",  # not ended by CRLF
        b"$1\r\n\x00\r\n$" + b"9" * 30 + b"\r\n",
        b"$" + b"1" * 5000,  # a line that never ends
    ],
)
def test_anything_else_is_an_invalid_response(pair, wire):
    ours, theirs = pair
    theirs.sendall(wire)
    with pytest.raises(redis.exceptions.InvalidResponse):
        blob_read(ours, 1000)
    assert classify(redis.exceptions.InvalidResponse("x")) == "error"


def test_a_connection_closed_midway(pair):
    ours, theirs = pair
    theirs.sendall(b"$1\r\n\x00\r\n$100\r\n" + b"a" * 50)
    theirs.close()
    with pytest.raises(redis.exceptions.ConnectionError) as info:
        blob_read(ours, 100)
    assert classify(info.value) == "error"


def test_a_server_that_stops_answering_is_a_timeout(pair):
    ours, theirs = pair
    ours.settimeout(0.05)
    theirs.sendall(b"$1\r\n\x00\r\n$100\r\n" + b"a" * 50)
    with pytest.raises(TimeoutError) as info:
        blob_read(ours, 100)
    assert classify(info.value) == "timeout"


def test_a_closed_connection_is_refused_before_reading():
    with pytest.raises(redis.exceptions.ConnectionError):
        Replies(redis, SimpleNamespace(_sock=None))


def test_an_index_reply_is_its_field_value_pairs(pair):
    ours, theirs = pair
    theirs.sendall(b"*4\r\n$1\r\na\r\n$1\r\n1\r\n$2\r\nbb\r\n$0\r\n\r\n")
    got = replies(ours)
    assert got.pairs(100, entries=64, budget=1 << 20) == [(b"a", b"1"), (b"bb", b"")] and got.drained
    theirs.sendall(b"*0\r\n")
    assert replies(ours).pairs(100, entries=64, budget=1 << 20) == []


def test_an_index_reply_in_pieces_is_read_whole(pair):
    ours, theirs = pair
    value = bytes(range(256)) * 300
    wire = b"*2\r\n$64\r\n%b\r\n$%d\r\n%b\r\n" % (b"f" * 64, len(value), value)
    writer = _trickle(theirs, wire, 5000)
    got = replies(ours)
    assert got.pairs(len(value), entries=64, budget=1 << 20) == [(b"f" * 64, value)] and got.drained
    writer.join()


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"*4\r\n$1\r\na\r\n$1000\r\n", "an entry of 1000 bytes, over 10"),
        (b"*132\r\n", "66 entries, more than the index holds (64)"),
        (
            b"*6\r\n$1\r\na\r\n$9\r\n123456789\r\n$1\r\nb\r\n$9\r\n123456789\r\n$1\r\nc\r\n$9\r\n",
            "more than 20 bytes in all",
        ),
    ],
)
def test_an_index_reply_past_its_bounds_is_oversize_and_read_no_further(pair, wire, why):
    """A hostile server (or a writer past the publish script's cap) sends any number of
    entries of any size: the read stops at the line that shows it, nothing past it read."""
    ours, theirs = pair
    theirs.sendall(wire)
    with pytest.raises(RemoteError) as info:
        replies(ours).pairs(10, entries=64, budget=20)
    assert info.value.reason == "oversize" and why in str(info.value)
    theirs.sendall(b"+PONG\r\n")  # (what followed the line was never asked for)
    assert ours.recv(100).endswith(b"+PONG\r\n")


def test_a_reply_sent_a_byte_at_a_time_ends_at_its_deadline(pair):
    """Each wait is bounded by the socket's timeout; all of them together by the deadline."""
    ours, theirs = pair
    ours.settimeout(0.2)
    stop = threading.Event()

    def trickle() -> None:
        theirs.sendall(b"*2\r\n$1\r\na\r\n$100\r\n")
        while not stop.wait(0.01):
            with contextlib.suppress(OSError):
                theirs.sendall(b"x")

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    started = time.monotonic()
    try:
        with pytest.raises((redis.exceptions.TimeoutError, TimeoutError)) as info:  # (both: reason timeout)
            Replies(redis, SimpleNamespace(_sock=ours), time.monotonic() + 0.3).pairs(1000, entries=64, budget=1 << 20)
    finally:
        stop.set()
        sender.join()
    assert classify(info.value) == "timeout"
    assert time.monotonic() - started < 1.5  # (a byte each 10 ms for 100 bytes: ~1 s without it)
    assert ours.gettimeout() == 0.2  # (the socket's own timeout, put back)


def test_an_error_reply_to_an_index_read_is_a_response_error(pair):
    ours, theirs = pair
    theirs.sendall(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n")
    with pytest.raises(redis.exceptions.ResponseError):
        replies(ours).pairs(100, entries=64, budget=1 << 20)


@pytest.mark.parametrize(
    "wire",
    [
        b"*1\r\n$1\r\na\r\n",  # a field without its value
        b"*-1\r\n",
        b"$1\r\na\r\n",
        b"*2\r\n:1\r\n:2\r\n",
        b"*2\r\n$1\r\naXY$1\r\nb\r\n",  # not ended by CRLF
        b"*2\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n",  # nested
    ],
)
def test_any_other_index_reply_is_an_invalid_response(pair, wire):
    ours, theirs = pair
    theirs.sendall(wire)
    with pytest.raises(redis.exceptions.InvalidResponse):
        replies(ours).pairs(100, entries=64, budget=1 << 20)


@pytest.mark.parametrize(
    "args", [("HGETALL", "sj:t1:cuda:idx:" + "ab" * 32), ("GETRANGE", "k", 0, 0), ("GETRANGE", "k\u00e9", 1, 1 << 40)]
)
def test_a_command_is_packed_as_redis_py_packs_it(args):
    encoder = redis.connection.Encoder("utf-8", "strict", decode_responses=False)
    assert _resp.pack(*args) == b"".join(redis.connection.PythonRespSerializer(1 << 20, encoder.encode).pack(*args))


@pytest.fixture
def scripted():
    made = []

    def start(answers: dict[bytes, bytes]) -> Scripted:
        made.append(Scripted(answers))
        return made[-1]

    yield start
    for server in made:
        server.close()


@pytest.mark.parametrize(
    ("answers", "call"),
    [
        ({b"GET": b":1\r\n"}, lambda store: store.lease_holder(K)),  # an integer for the holder's token
        ({b"FCALL": b"$3\r\nabc\r\n"}, lambda store: store.publish_manifest(K, D, b"{}")),  # text for a count
    ],
    ids=["holder", "publish"],
)
def test_a_reply_of_another_type_is_a_remote_error(make_store, scripted, answers, call):
    """Converted after the guard, such a reply raised AttributeError or ValueError out of
    compile() (the holder's token) or ended the upload thread (the publish count)."""
    server = scripted({b"PING": b"+PONG\r\n", b"SCRIPT": b"$40\r\n" + b"0" * 40 + b"\r\n", **answers})
    store = make_store(server.url)
    with pytest.raises(RemoteError) as info:
        call(store)
    assert info.value.reason == "error"


class _Panic(BaseException):
    """What a Rust client raises when it panics (pyo3's PanicException is a BaseException)."""


def test_a_client_panic_is_a_remote_error(redis_server, make_store, monkeypatch):
    store = make_store(redis_server.url)

    def panic(*args, **kwargs):
        raise _Panic("invalid port")

    monkeypatch.setattr(redis.Redis, "set", panic)
    with pytest.raises(RemoteError) as info:
        store.acquire_lease(K)
    assert info.value.reason == "error" and "_Panic" in str(info.value)


def test_a_scan_whose_cursor_never_comes_back_to_zero_ends(make_store, scripted, monkeypatch):
    """A server that answers every SCAN with a cursor of 7 and no key kept `safejit remote
    stats|ls|verify` going for good."""
    from safejit.cache.remote import redis as redis_engine

    monkeypatch.setattr(redis_engine, "SCAN_PAGES_MAX", 50)
    server = scripted({b"PING": b"+PONG\r\n", b"SCAN": b"*2\r\n$1\r\n7\r\n*0\r\n"})
    store = make_store(server.url)
    with pytest.raises(RemoteError) as info:
        list(store.scan("index", limit=10))
    assert info.value.reason == "error" and "did not end within 50 pages" in str(info.value)


def test_an_index_replys_deadline_grows_with_the_sizes_it_announces_only(pair):
    """A small index keeps a small deadline however large an index could be (sized for the
    largest, a server trickling a tiny one held a lookup for seconds); a large one gets
    the time its size needs."""
    ours, theirs = pair
    ours.settimeout(1.0)

    def allow(nbytes: int) -> float:
        return 0.2 if nbytes < 1000 else 5.0

    theirs.sendall(b"*2\r\n$1\r\na\r\n$100\r\n" + b"x" * 10)  # (then nothing more)
    started = time.monotonic()
    with pytest.raises((redis.exceptions.TimeoutError, TimeoutError)):
        Replies(redis, SimpleNamespace(_sock=ours), time.monotonic() + 0.2, allow=allow).pairs(
            5000, entries=64, budget=1 << 20
        )
    assert time.monotonic() - started < 0.9
    ours.close()
    theirs.close()

    ours, theirs = socket.socketpair()
    ours.settimeout(1.0)
    value = b"y" * 2000

    def send_slowly() -> None:
        theirs.sendall(b"*2\r\n$1\r\na\r\n$2000\r\n" + value[:1000])
        time.sleep(0.5)  # (past the small deadline, within the large one)
        theirs.sendall(value[1000:] + b"\r\n")

    sender = threading.Thread(target=send_slowly, daemon=True)
    sender.start()
    got = Replies(redis, SimpleNamespace(_sock=ours), time.monotonic() + 0.2, allow=allow).pairs(
        5000, entries=64, budget=1 << 20
    )
    sender.join()
    assert got == [(b"a", value)]
    ours.close()
    theirs.close()


def test_an_index_replys_budget_counts_its_names_too(pair):
    """A writer's plain HSETNX may use names as long as the manifest limit: counted, or a
    read took 64 such names (66 MB) past the budget."""
    ours, theirs = pair
    theirs.sendall(b"*2\r\n$12\r\nnnnnnnnnnnnn\r\n$1\r\nv\r\n")
    with pytest.raises(RemoteError) as info:
        replies(ours).pairs(100, entries=64, budget=10)
    assert info.value.reason == "oversize"


@pytest.mark.parametrize(
    ("text", "unknown"),
    [
        ("unknown command 'FCALL', with args beginning with: 'safejit_publish_v3' ", True),  # Valkey
        ("ERR unknown command `FCALL`, with args beginning with: `safejit_publish_v3`, ", True),  # Redis 6
        ("Unknown command called from script script: safejit_publish_v3, on @user_function:7.", False),
        ("unknown command 'HSTRLEN'", False),
    ],
)
def test_only_fcall_itself_unknown_makes_a_client_run_scripts(text, unknown):
    from safejit.cache.remote._functions import _FCALL_UNKNOWN

    assert bool(_FCALL_UNKNOWN.search(text)) is unknown


def test_an_index_read_with_a_head_behind_it_receives_none_of_the_heads_bytes(pair):
    """A head's reply follows the index's on the connection: read ``exact``, the index
    takes no more than a few bytes past its end, and the head's value is the bytes one
    receive made (not pieces joined: a copy of the whole)."""
    ours, theirs = pair
    manifest = b"m" * 3000
    index = b"*2\r\n$64\r\n" + D.encode() + b"\r\n$3000\r\n" + manifest + b"\r\n"
    head = b"h" * 200_000
    writer = threading.Thread(target=theirs.sendall, args=(index + b"$1\r\n\x00\r\n$200000\r\n" + head + b"\r\n",))
    writer.start()
    time.sleep(0.05)  # (as much of it there as the socket holds before the index is read)
    got = replies(ours)
    assert got.pairs(1 << 20, entries=8, budget=8 << 20, exact=True) == [(D.encode(), manifest)]
    assert len(got._left) <= 16
    assert got.bulk(1, expect=1) == b"\x00"
    value = got.bulk(200_001, expect=200_000)
    writer.join()
    assert value == head and got.drained
