"""Connecting to a Redis-protocol remote: redis-py's connection class for the URL's
scheme (:func:`connection_class`), its host name resolved within the connect deadline.

A client connects through ``getaddrinfo``, which nothing bounds: against a resolver
that does not answer, glibc waits 5 s an attempt, and every connect waits again (no
cache), so each remote call of a compile waited it out, and the failures, seen as
errors, not timeouts, left the breaker closed. Here a name is resolved on a thread of
its own, waited for at most the connect deadline (a resolution still under way is
joined, never started twice), and remembered for :data:`KEEP_S`; a name that did not
resolve in time is a ``TimeoutError``, which the guard counts as a timeout."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final

from ... import faults
from ._watchdog import bounded
from .settings import RemoteSettings

__all__ = ["KEEP_S", "TRIED", "connection_class", "resolve"]

#: How long a resolved address is used before the name is resolved again (a server moved
#: by DNS is followed within this).
KEEP_S: Final = 30.0

_lock = threading.Lock()
#: The addresses of a name tried, at most (each connect bounded by the connect deadline).
TRIED: Final = 4
#: A reply redis-py reads itself, or a connection's handshake, is given this many of its
#: waits (the socket's timeout) in all.
_WAITS: Final = 4

#: (host, port) -> (addresses, when they expire; ``time.monotonic()``)
_known: dict[tuple[str, int], tuple[tuple[str, ...], float]] = {}
_pending: dict[tuple[str, int], Future[tuple[str, ...]]] = {}


def _forget() -> None:  # (a forked child has none of its parent's resolver threads)
    global _lock
    _lock = threading.Lock()
    _pending.clear()


os.register_at_fork(after_in_child=_forget)


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _lookup(host: str, port: int, fut: Future[tuple[str, ...]]) -> None:
    try:
        found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        addresses = tuple(dict.fromkeys(str(info[4][0]) for info in found))[:TRIED]
        if not addresses:
            raise OSError(f"no address for {host}")
    except BaseException as exc:  # (told to whoever waits; this thread ends here)
        fut.set_exception(exc)
    else:
        with _lock:
            _known[(host, port)] = (addresses, time.monotonic() + KEEP_S)
        fut.set_result(addresses)
    finally:
        with _lock:
            if _pending.get((host, port)) is fut:
                del _pending[(host, port)]


def resolve(host: str, port: int, timeout: float) -> tuple[str, ...]:
    """The addresses of ``host`` (itself when it is one), in the order the resolver gave
    them (at most :data:`TRIED`), within ``timeout`` seconds."""
    if _numeric(host):
        return (host,)
    key = (host, port)
    with _lock:
        known = _known.get(key)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        fut = _pending.get(key)
        if fut is None:
            fut = _pending[key] = Future()
            threading.Thread(target=_lookup, args=(host, port, fut), name="safejit-resolve", daemon=True).start()
    try:
        return fut.result(timeout=timeout)
    except FutureTimeout:
        raise TimeoutError(f"resolving {host} took longer than {timeout:g} s") from None


def connection_class(redis: Any, settings: RemoteSettings) -> type:
    """redis-py's connection class for the URL's scheme, with the ``remote.connect`` fault
    point at every connect."""
    scheme = settings.url.scheme
    base = {
        "redis": redis.Connection,
        "rediss": redis.SSLConnection,
        "unix": redis.UnixDomainSocketConnection,
    }[scheme]

    class _Connection(base):  # type: ignore[misc, valid-type]
        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            # (a whole reply within a few of its waits: each wait is bounded by the socket's
            # timeout, the whole by nothing else; a byte now and then held it for good)
            with bounded(self, _WAITS * (self.socket_timeout or settings.op_timeout_s)):
                return super().read_response(*args, **kwargs)

        def connect(self, *args: Any, **kwargs: Any) -> None:
            if self._sock is None:
                # (the handshake too: AUTH's reply, SELECT's, read by redis-py as it connects)
                wait = _WAITS * (self.socket_timeout or settings.op_timeout_s)
                with bounded(self, settings.connect_timeout_s * TRIED + wait):
                    self._connect_resolved(*args, **kwargs)
            else:
                super().connect(*args, **kwargs)

        def _connect_resolved(self, *args: Any, **kwargs: Any) -> None:
            # (called with no socket yet: see connect)
            faults.point("remote.connect")
            if scheme != "unix":
                # The name resolved within the connect deadline (getaddrinfo has none), and
                # each address it has tried in turn, as the client does. Over TLS the client
                # resolves it again itself: the certificate is checked against the name,
                # which it connects by.
                name: str = self.__dict__.setdefault("_safejit_name", str(getattr(self, "host", "")))
                addresses = resolve(name, self.port, settings.connect_timeout_s)
                if scheme == "redis":
                    for address in addresses[:-1]:
                        self.host = address
                        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                            super().connect(*args, **kwargs)
                            break
                    else:
                        self.host = addresses[-1]
            super().connect(*args, **kwargs)

    _Connection.__name__ = _Connection.__qualname__ = f"Safejit{base.__name__}"
    return _Connection
