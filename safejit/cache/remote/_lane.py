"""The connections of the hot reads (``redis.py``'s index and blob reads), taken from a
redis-py pool and kept, between reads, in a list of their own: not handed back through
the pool's per-call machinery (its lock, its metrics, its checks: about 30 us a read
here). A kept connection stays warm: its receive buffer grows with what it carries (TCP
autotuning: the first 1 MB reads of a fresh one took 3.9, 2.0, 1.4 ms here, later ones
0.5).

What the pool checks when it hands out a connection is checked for a kept one too: one
with a byte to read (the server closed it, or left a reply) is dropped for a fresh one. A
connection is kept only after an exchange read to its end; anything else drops it with
the connection (its reply unread). The pool still makes, counts and closes every
connection: ``disconnect`` reaches the kept ones too."""

from __future__ import annotations

import os
from typing import Any

from ._resp import command_name

__all__ = ["Lane"]


class Lane:
    """The hot reads' connections of one redis-py ``pool``, kept apart from it."""

    __slots__ = ("_idle", "_pid", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._idle: list[Any] = []
        self._pid = os.getpid()

    def take(self) -> Any:
        """A connected connection that carries nothing (connecting one if need be; the
        pool takes back one that fails to)."""
        if self._pid != os.getpid():
            # A forked child: the parent's connections are the parent's (never closed here).
            self._idle, self._pid = [], os.getpid()
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return self._pool.get_connection(*command_name(self._pool.__class__))
            if self._clean(conn):
                return conn
            self.drop(conn)

    @staticmethod
    def _clean(conn: Any) -> bool:
        if conn._sock is None:  # (closed since: the pool disconnected it)
            return False
        try:
            return not conn.can_read(timeout=0)
        except Exception:
            return False

    def give(self, conn: Any) -> None:
        """``conn``'s exchange was read to its end: keep it for the next read."""
        self._idle.append(conn)

    def drop(self, conn: Any) -> None:
        """Close ``conn`` (a reply left unread goes with it) and hand it back to the pool."""
        try:
            conn.disconnect()
        finally:
            self._pool.release(conn)
