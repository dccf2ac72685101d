"""The whole-reply deadlines of what redis-py reads itself (``_watchdog``): a socket is shut
down once its reply is late, never one whose reply is in; a thread that cannot be started
leaves each wait bounded as before, and is started by a later call."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from safejit.cache.remote import _watchdog

_made: list[_Conn] = []


class _Conn:
    def __init__(self) -> None:
        self._sock, self.peer = socket.socketpair()
        _made.append(self)


def test_a_late_reply_has_its_socket_shut_down_and_one_in_time_is_left_alone():
    late, in_time = _Conn(), _Conn()
    with _watchdog.bounded(in_time, 5):
        pass
    with _watchdog.bounded(late, 0.05):
        late._sock.settimeout(5)
        started = time.monotonic()
        assert late._sock.recv(1) == b""  # (shut down: the read returns)
        assert time.monotonic() - started < 4
    in_time.peer.sendall(b"x")
    assert in_time._sock.recv(1) == b"x"


def test_a_watchdog_that_cannot_start_leaves_no_entry_and_starts_later(monkeypatch):
    """Its start failing (no thread to be had) left it marked started: no deadline was
    enforced again in the process, and every call's entry stayed in the heap for good."""
    monkeypatch.setattr(_watchdog, "_started", False)
    monkeypatch.setattr(_watchdog, "_heap", [])
    real = threading.Thread.start

    def failing(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", failing)
    for _ in range(100):
        with _watchdog.bounded(_Conn(), 0.01):
            pass
    assert _watchdog._heap == [] and not _watchdog._started
    monkeypatch.setattr(threading.Thread, "start", real)
    late = _Conn()
    with _watchdog.bounded(late, 0.05):
        late._sock.settimeout(5)
        assert late._sock.recv(1) == b""
    assert _watchdog._started


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test with a watchdog of its own (the module's state put back after)."""
    lock = threading.Lock()
    monkeypatch.setattr(_watchdog, "_lock", lock)
    monkeypatch.setattr(_watchdog, "_wake", threading.Condition(lock))
    monkeypatch.setattr(_watchdog, "_heap", [])
    monkeypatch.setattr(_watchdog, "_started", False)
    yield
    for conn in _made:
        conn._sock.close()
        conn.peer.close()
    _made.clear()
