"""Whole-reply deadlines for what redis-py reads itself: a connection's handshake (AUTH,
SELECT, the client's name) and every reply its parser reads (a lease's ``SET``, the
functions' ``FCALL``, ``EXISTS``, a scan's pages).

redis-py bounds each wait for a piece of a reply by the socket's timeout, and nothing
bounds the whole: a server, or a proxy, that sent a byte now and then held a compile
for good (the hot reads have deadlines of their own: ``_resp.Replies``). Here one
thread ends each reply still awaited past its deadline by shutting its connection's
socket down: the blocked read returns, redis-py raises ``ConnectionError``, and the
guard counts a failure (the breaker opens on them) and the connection is dropped."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["bounded"]

_lock = threading.Lock()
_wake = threading.Condition(_lock)
#: [deadline, order, connection]: the connection None once its reply is in.
_heap: list[list[Any]] = []
_order = itertools.count()
_started = False


def _forget() -> None:  # (a forked child: none of its parent's thread, lock or waiters)
    global _lock, _wake, _heap, _started
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _heap = []
    _started = False


os.register_at_fork(after_in_child=_forget)


@contextlib.contextmanager
def bounded(conn: Any, seconds: float) -> Iterator[None]:
    """Within this block, ``conn``'s socket is shut down once ``seconds`` have passed."""
    global _started
    entry = [time.monotonic() + seconds, next(_order), conn]
    with _lock:
        if not _started:
            try:
                threading.Thread(target=_run, args=(_wake, _heap), name="safejit-remote-deadlines", daemon=True).start()
            except RuntimeError:  # (no thread to be had now: each wait stays bounded; the next call tries again)
                entry[2] = None
            else:
                _started = True
        if _started:
            heapq.heappush(_heap, entry)
            if _heap[0] is entry:
                _wake.notify()
    try:
        yield
    finally:
        with _lock:  # (the thread shuts a socket down under it: never one whose reply is in)
            entry[2] = None


def _run(wake: threading.Condition, heap: list[list[Any]]) -> None:
    with wake:
        while True:
            while heap and heap[0][2] is None:
                heapq.heappop(heap)
            if not heap:
                wake.wait()
                continue
            left = heap[0][0] - time.monotonic()
            if left > 0:
                wake.wait(left)
                continue
            conn = heapq.heappop(heap)[2]
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
