"""RESP replies read off a redis-py connection without redis-py's parser or command
machinery (``redis.py``'s hot reads): a blob read's bulk strings received straight into
the bytes handed back, an index read's field-value pairs (:class:`Replies`), and the
commands they answer, packed here (:func:`pack`). redis-py is passed in, never imported."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from .store import RemoteError

__all__ = ["Hasher", "Replies", "command_name", "pack"]


class Hasher(Protocol):
    """What a bulk read can feed the bytes it receives to (``blake3.blake3``)."""

    def update(self, data: bytes, /) -> Any: ...


#: The longest first line of a reply to a blob read that is read (an error's text is longer
#: than a bulk string's header, but not by this much).
_LINE_LIMIT: Final = 4096
#: A bulk string this short is asked for with its header (one ``recv`` for the codec byte).
_SMALL: Final = 64
#: What an index read asks for at once (its reply is a few KB a leaf: one ``recv`` takes it).
_INDEX_GUESS: Final = 64 << 10
#: ... when a reply follows it: a line's likely length (an array's or bulk string's header),
#: so that what is received past the index's last byte is at most a few bytes of the next.
_HEADER_GUESS: Final = 16
#: A value up to this size is asked for whole (one ``recv``, into the bytes object handed back,
#: when it has all arrived); what is still missing after that, a piece of at most _PIECE at a time.
_AT_ONCE: Final = 32 << 20
_PIECE: Final = 1 << 20


class Replies:
    """Bulk-string replies read straight off a connection's socket, not through redis-py's
    parser (which reads 64 KiB at a time, copies each piece into its own buffer, then the
    whole value into a bytes object): a value's bytes are received into the object handed
    back, in one ``recv`` when they are all there, else joined once from the pieces received
    (never more than the value's length is allocated). Used only on a connection that carries
    nothing but the commands whose replies are read here (redis-py's parser holds no byte
    of them); any failure leaves the connection to be dropped."""

    __slots__ = ("_allow", "_deadline", "_errors", "_left", "_sock", "_start")

    def __init__(
        self, redis: Any, conn: Any, deadline: float | None = None, *, allow: Callable[[int], float] | None = None
    ) -> None:
        self._errors = redis.exceptions
        self._sock = conn._sock
        if self._sock is None:
            raise self._errors.ConnectionError("Connection closed by server.")
        self._left = b""  # bytes received past the last reply or line read
        #: When the replies must all be in (``time.monotonic()``): each wait is bounded by the
        #: socket's timeout, and all of them together by this (a server that sends a byte
        #: now and then would hold a read for good).
        self._deadline = deadline
        #: ``allow(nbytes)``: seconds a reply of that size may take (counted from now); the
        #: deadline grows with what the reply says it carries, as it says it (a small reply
        #: keeps the deadline of a small one).
        self._start, self._allow = time.monotonic(), allow

    def restart(self, deadline: float) -> None:
        """The next replies (another command's, sent behind) must all be in by ``deadline``."""
        self._deadline, self._start = deadline, time.monotonic()

    def _expect(self, nbytes: int) -> None:
        if self._allow is not None and self._deadline is not None:
            self._deadline = max(self._deadline, self._start + self._allow(nbytes))

    @property
    def drained(self) -> bool:
        """Whether no byte past the replies read was received (the connection may carry
        the next command; else it is dropped)."""
        return not self._left

    def bulk(self, limit: int, *, expect: int, hasher: Hasher | None = None) -> bytes:
        """The next reply, a bulk string of at most ``limit`` bytes; an error reply is raised
        as redis-py's ``ResponseError``. ``expect``: the length it likely has (what it likely
        spans is asked for at once, and no byte past it). ``hasher``: given the value's bytes
        piece by piece as they are received (hashing while the rest is still on its way)."""
        header = len(b"$%d\r\n" % expect)
        line = self._line(header + expect + 2 if expect <= _SMALL else header)
        if line == b"$-1":
            return b""  # (a nil bulk string: GETRANGE answers "" instead, but either says absent)
        size = self._count(line, b"$", "GETRANGE")
        if size > limit:
            raise self._errors.InvalidResponse(f"unexpected reply to GETRANGE: {line[:40]!r}")
        return self._ended(self._exactly(size, hasher))

    def pairs(self, limit: int, *, entries: int, budget: int, exact: bool = False) -> list[tuple[bytes, bytes]]:
        """The next reply, HGETALL's: its (field, value) pairs, at most ``entries`` of them,
        each at most ``limit`` bytes long and ``budget`` in all: a reply past any of
        these is ``oversize``, and nothing past the first line that shows it is read (the
        connection, its reply unread, is dropped). ``exact``: a large reply follows (a
        head's): no byte of it is received with these (read in pieces, a value received
        after a few of its first bytes were is joined: a copy of the whole)."""
        guess = _HEADER_GUESS if exact else _INDEX_GUESS
        line = self._line(guess)
        n = self._count(line, b"*", "HGETALL")
        if n % 2:
            raise self._errors.InvalidResponse(f"unexpected reply to HGETALL: {line[:40]!r}")
        if n // 2 > entries:
            raise RemoteError("oversize", "index", f"{n // 2} entries, more than the index holds ({entries})")
        flat: list[bytes] = []
        total = 0
        for _ in range(n):
            size = self._count(self._line(guess), b"$", "HGETALL")
            total += size  # (names and manifests: what the publish function counts too)
            self._expect(total)
            if size > limit:
                raise RemoteError("oversize", "index", f"an entry of {size} bytes, over {limit}")
            if total > budget:
                raise RemoteError("oversize", "index", f"entries of more than {budget} bytes in all")
            flat.append(self._ended(self._exactly(size)))
        return list(zip(flat[::2], flat[1::2], strict=True))

    def _count(self, line: bytes, kind: bytes, command: str) -> int:
        """The length a reply's first line gives for a reply of ``kind`` (``$``, ``*``); an
        error reply is raised as redis-py's ``ResponseError``, anything else is invalid."""
        if line[:1] == b"-":
            raise self._errors.ResponseError(line[1:].decode("utf-8", "replace"))
        rest = line[1:]
        if line[:1] != kind or not rest.isdigit() or len(rest) > 20:
            raise self._errors.InvalidResponse(f"unexpected reply to {command}: {line[:40]!r}")
        return int(rest)

    def _ended(self, value: bytes) -> bytes:
        if self._exactly(2) != b"\r\n":
            raise self._errors.InvalidResponse("a bulk string not ended by CRLF")
        return value

    def _recv(self, n: int) -> bytes:
        sock, timeout = self._sock, None
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise self._errors.TimeoutError("the reply took longer than its deadline")
            timeout = sock.gettimeout()
            if timeout is not None and left < timeout:
                sock.settimeout(left)  # (the last wait ends at the deadline; put back below)
            else:
                timeout = None
        try:
            got: bytes = sock.recv(n)
        finally:
            if timeout is not None:
                sock.settimeout(timeout)
        if not got:
            raise self._errors.ConnectionError("Connection closed by server.")
        return got

    def _line(self, guess: int) -> bytes:
        """The next line, without its CRLF. ``guess``: its likely length with the CRLF, asked
        for at once (so that, when right, nothing past it is received)."""
        buf = self._left
        while (end := buf.find(b"\r\n")) < 0:
            if len(buf) > _LINE_LIMIT:
                raise self._errors.InvalidResponse("a reply line over 4096 bytes")
            buf += self._recv(guess - len(buf) if guess > len(buf) else 256)
        self._left = buf[end + 2 :]
        return buf[:end]

    def _exactly(self, n: int, hasher: Hasher | None = None) -> bytes:
        """The next ``n`` bytes: the bytes object ``recv`` made when they were all there at
        once, else the pieces received joined (one copy). ``hasher`` is given each piece
        as it is received."""
        left = self._left
        if len(left) >= n:
            self._left, got = left[n:], left[:n]
            if hasher is not None:
                hasher.update(got)
            return got
        self._left = b""
        parts = [left] if left else []
        if hasher is not None and left:
            hasher.update(left)
        have = len(left)
        while have < n:
            got = self._recv(n - have if not parts and n <= _AT_ONCE else min(n - have, _PIECE))
            if hasher is not None:
                hasher.update(got)
            parts.append(got)
            have += len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)


def pack(*args: str | int) -> bytes:
    """One command as RESP, an array of bulk strings (as redis-py packs it: text as UTF-8,
    numbers in decimal)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


@functools.cache
def command_name(pool_class: Any) -> tuple[str, ...]:
    """What ``get_connection`` takes: a command name before redis-py 6, which then deprecated it."""
    name = inspect.signature(pool_class.get_connection).parameters.get("command_name")
    return ("GETRANGE",) if name is not None and name.default is inspect.Parameter.empty else ()
