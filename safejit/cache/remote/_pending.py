"""A Redis blob read under way (:class:`PendingGet`, what ``RedisStore.start_blob``
returns, and a build key's head read behind its index): asked for at once, its replies
read later straight off the connection (``_resp.Replies``), a raw artifact hashed as it
is received."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Final

from ...closure.hashing import new_hasher
from . import codec
from ._resp import Replies, pack

if TYPE_CHECKING:
    import blake3

    from ._lane import Lane
    from .redis import RedisStore

__all__ = ["RAW_HEAD", "PendingGet"]

#: A stored value's codec byte for a raw artifact (hashed as it is received).
RAW_HEAD: Final = bytes((codec.RAW,))


class PendingGet:
    """``GETRANGE key 0 0`` and ``GETRANGE key 1 cap+1`` (the codec byte, then the rest: a raw
    artifact arrives as one bytes object of its own, not to be copied out of the value),
    sent together on a connection of the pool; the replies are read by :meth:`result` (the bytes
    arrive meanwhile) or dropped with the connection by :meth:`cancel`. The range ends one
    byte past the cap: a larger value is ``oversize`` and never read whole. A raw value is
    hashed piece by piece as it is received (``digest``), while the rest is on its way."""

    __slots__ = ("_cap", "_conn", "_error", "_lane", "_replies", "_skip", "_start", "_store", "digest")

    def __init__(self, store: RedisStore, key: str, cap: int) -> None:
        self._store = store
        self._cap = cap
        self._skip = 0
        self.digest: str | None = None
        self._lane = store._lane(cap + 1)
        self._conn: Any = None
        self._error: Exception | None = None
        self._replies: Replies | None = None
        self._start = time.perf_counter()
        try:
            conn = self._lane.take()  # (connects if need be; the pool takes back one that fails)
        except Exception as exc:
            self._error = exc
            return
        try:
            conn._sock.sendall(self.request(key, cap))
        except Exception as exc:
            self._error = exc
            self._lane.drop(conn)
            return
        self._conn = conn

    @staticmethod
    def request(key: str, cap: int, skip: int = 0) -> bytes:
        """The two GETRANGEs of a value that starts with ``skip`` bytes of its own (a head's
        digest) before its codec byte."""
        return pack("GETRANGE", key, 0, skip) + pack("GETRANGE", key, skip + 1, skip + cap + 1)

    @classmethod
    def behind(
        cls, store: RedisStore, lane: Lane, conn: Any, replies: Replies, cap: int, *, skip: int = 0
    ) -> PendingGet:
        """The read whose :meth:`request` went out behind another command on ``conn``, whose
        reply ``replies`` read (what was received past it is the start of this one's)."""
        self = cls.__new__(cls)
        self._store, self._cap, self._skip, self.digest, self._lane = store, cap, skip, None, lane
        self._conn, self._error, self._replies = conn, None, replies
        self._start = time.perf_counter()
        return self

    def result(self, *, want: str | None = None) -> memoryview | None:
        """The value (see ``RemoteStore.get_blob``). ``want``: the digest a value with one
        of its own in front (a head) must say it holds; one that says another is read off
        the connection and dropped, never decoded or hashed, and is None (absent)."""
        try:
            head, payload, hasher = self._store._guard.run(
                "get_blob",
                "remote.get",
                lambda: self._read(want),
                received=lambda r: len(r[0]) + len(r[1]),
                start=self._start,
            )
        finally:
            self.cancel()  # only when the replies were not read (the fault point raised first)
        view = self._store._decoded(head, payload, self._cap)
        if hasher is not None and view is not None and view.obj is payload:  # (the hashed bytes themselves)
            self.digest = hasher.hexdigest()
        return view

    def _read(self, want: str | None) -> tuple[bytes, bytes, blake3.blake3 | None]:
        if self._error is not None:
            raise self._error
        conn, self._conn = self._conn, None
        try:
            # (the whole reply within the deadline the lane's sockets wait for each piece of it,
            # counted from here: not the caller's own checks while the bytes travelled)
            deadline = time.monotonic() + self._store.settings.reply_deadline(self._cap + 1)
            if self._replies is None:
                replies = Replies(self._store._redis, conn, deadline)
            else:
                replies = self._replies
                replies.restart(deadline)
            skip = self._skip
            lead = replies.bulk(skip + 1, expect=skip + 1)
            head = lead[skip:]
            if skip and want is not None and lead[:skip].hex() != want:  # (another leaf's, or none)
                replies.bulk(self._cap + 1, expect=0)  # (read, dropped)
                head, payload, hasher = b"", b"", None
            else:
                hasher = new_hasher() if head == RAW_HEAD else None
                payload = replies.bulk(self._cap + 1, expect=self._cap, hasher=hasher)
        except BaseException:
            self._lane.drop(conn)  # an error reply to the first leaves the second unread
            raise
        if replies.drained:
            self._lane.give(conn)
        else:
            self._lane.drop(conn)
        return head, payload, hasher

    def cancel(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        replies = self._replies
        try:
            if replies is not None:
                # Behind an index read: read to its end and keep the connection, warm (a head is
                # small; an absent one two empty replies, there already), within an operation's
                # deadline; else it is dropped.
                with contextlib.suppress(Exception):
                    replies.restart(time.monotonic() + self._store.settings.op_timeout_s)
                    replies.bulk(self._skip + 1, expect=self._skip + 1)
                    replies.bulk(self._cap + 1, expect=0)
                    if replies.drained:
                        self._lane.give(conn)
                        conn = None
        finally:
            if conn is not None:  # (also when interrupted while reading: never left out of the pool, half read)
                with contextlib.suppress(Exception):
                    self._lane.drop(conn)  # the reply is dropped unread, with the connection carrying it
