"""RESP replies read off a redis-py connection without redis-py's parser or command
machinery (``redis.py``'s hot reads): a blob read's bulk strings received straight into
the bytes handed back (:class:`Replies`), and one command's reply on a pooled connection
(:func:`command`). redis-py is passed in or imported when called, never at import."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["Replies", "command", "command_name", "hash_pairs"]

#: The longest first line of a reply to a blob read that is read (an error's text is longer
#: than a bulk string's header, but not by this much).
_LINE_LIMIT: Final = 4096
#: A bulk string this short is asked for with its header (one ``recv`` for the codec byte).
_SMALL: Final = 64
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

    __slots__ = ("_errors", "_left", "_sock")

    def __init__(self, redis: Any, conn: Any) -> None:
        self._errors = redis.exceptions
        self._sock = conn._sock
        if self._sock is None:
            raise self._errors.ConnectionError("Connection closed by server.")
        self._left = b""  # bytes received past the last reply or line read

    def bulk(self, limit: int, *, expect: int) -> bytes:
        """The next reply, a bulk string of at most ``limit`` bytes; an error reply is raised
        as redis-py's ``ResponseError``. ``expect``: the length it likely has (what it likely
        spans is asked for at once, and no byte past it)."""
        header = len(b"$%d\r\n" % expect)
        line = self._line(header + expect + 2 if expect <= _SMALL else header)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise self._errors.ResponseError(rest.decode("utf-8", "replace"))
        if line == b"$-1":
            return b""  # (a nil bulk string: GETRANGE answers "" instead, but either says absent)
        size = int(rest) if kind == b"$" and rest.isdigit() and len(rest) <= 20 else -1
        if not 0 <= size <= limit:
            raise self._errors.InvalidResponse(f"unexpected reply to GETRANGE: {line[:40]!r}")
        value = self._exactly(size)
        if self._exactly(2) != b"\r\n":
            raise self._errors.InvalidResponse("a bulk string not ended by CRLF")
        return value

    def _recv(self, n: int) -> bytes:
        got: bytes = self._sock.recv(n)
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

    def _exactly(self, n: int) -> bytes:
        """The next ``n`` bytes: the bytes object ``recv`` made when they were all there at
        once, else the pieces received joined (one copy)."""
        left = self._left
        if len(left) >= n:
            self._left = left[n:]
            return left[:n]
        self._left = b""
        parts = [left] if left else []
        have = len(left)
        while have < n:
            got = self._recv(n - have if not parts and n <= _AT_ONCE else min(n - have, _PIECE))
            parts.append(got)
            have += len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)


def command(pool: _redis.ConnectionPool, *args: Any) -> Any:
    """One command's raw reply, on a connection of ``pool`` (a lookup's index read: redis-py's
    client adds its command machinery, about 20 us a lookup here, and nothing this needs)."""
    conn: Any = pool.get_connection(*command_name(type(pool)))
    try:
        conn.send_command(*args)
        return conn.read_response()
    except BaseException:
        conn.disconnect()  # (a reply left unread would be the next command's)
        raise
    finally:
        pool.release(conn)


def hash_pairs(reply: Any) -> list[tuple[bytes, bytes]]:
    """HGETALL's flat reply as (field, value) pairs; anything else is an invalid response."""
    import redis

    if not isinstance(reply, list) or len(reply) % 2 or not all(isinstance(x, bytes) for x in reply):
        raise redis.exceptions.InvalidResponse(f"unexpected reply to HGETALL: {type(reply).__name__}")
    return list(zip(reply[::2], reply[1::2], strict=True))


@functools.cache
def command_name(pool_class: Any) -> tuple[str, ...]:
    """What ``get_connection`` takes: a command name before redis-py 6, which then deprecated it."""
    name = inspect.signature(pool_class.get_connection).parameters.get("command_name")
    return ("GETRANGE",) if name is not None and name.default is inspect.Parameter.empty else ()
