"""The one boundary every engine operation crosses: the breaker check, the fault point,
the timing, and the translation of whatever the client raised into a
:class:`RemoteError` with a reason and a redacted message."""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Final, TypeVar

from ... import faults
from .breaker import Breaker
from .settings import RemoteSettings
from .store import OpObserver, Reason, RemoteError

__all__ = ["Guard", "os_reason"]

logger = logging.getLogger("safejit.cache.remote")

T = TypeVar("T")
_DETAIL_LIMIT: Final = 240
#: errnos that say "nobody listens there" rather than "it broke on the way".
_REFUSED: Final = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.EHOSTUNREACH, errno.ENETUNREACH})
_TIMEOUT: Final = frozenset({errno.ETIMEDOUT, errno.EAGAIN})
_DENIED: Final = frozenset({errno.EACCES, errno.EPERM})
#: A name the resolver did not answer for in time / says does not exist.
_RESOLVER_TIMEOUT: Final = frozenset({socket.EAI_AGAIN})
_NO_SUCH_HOST: Final = frozenset({socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)})


def os_reason(exc: BaseException) -> Reason | None:
    """The reason an ``OSError`` in ``exc``'s cause chain gives, if any."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, TimeoutError):
            return "timeout"
        if isinstance(cur, ConnectionRefusedError | FileNotFoundError):
            return "refused"
        if isinstance(cur, socket.gaierror):
            if cur.errno in _RESOLVER_TIMEOUT:
                return "timeout"
            if cur.errno in _NO_SUCH_HOST:
                return "refused"
        if isinstance(cur, OSError) and cur.errno is not None:
            if cur.errno in _TIMEOUT:
                return "timeout"
            if cur.errno in _REFUSED:
                return "refused"
            if cur.errno in _DENIED:
                return "denied"
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


class Guard:
    """Runs engine operations; ``classify`` maps a client exception to a reason."""

    def __init__(
        self,
        engine: str,
        settings: RemoteSettings,
        breaker: Breaker,
        classify: Callable[[BaseException], Reason],
        observer: OpObserver | None = None,
        describe: Callable[[BaseException], str | None] | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.breaker = breaker
        self._classify = classify
        self._observer = observer
        self._describe = describe
        #: Set when the store is closed: every operation but letting a lease go is refused
        #: at :meth:`admit`.
        self.closed = False

    def admit(self, op: str, *, releasing: bool = False) -> None:
        """Raise ``circuit_open`` unless the breaker lets a call through now. Called once per
        public operation (lookups call it first of all, so that an open breaker costs about a
        branch). A call admitted as the probe records its outcome in :meth:`run`; one that
        fails before reaching the remote (a malformed key) leaves the probe to expire, and
        the next one goes out an interval later."""
        breaker = self.breaker
        if not breaker.closed and not breaker.allow():  # the closed case without a call
            raise RemoteError("circuit_open", op, engine=self.engine)
        if self.closed and not releasing:
            raise RemoteError("error", op, "the store is closed", engine=self.engine)

    def run(
        self,
        op: str,
        point: str,
        fn: Callable[[], T],
        *,
        sent: int = 0,
        received: Callable[[T], int] | None = None,
        start: float | None = None,
    ) -> T:
        """``fn()``, or a :class:`RemoteError`. ``point`` is the fault point fired first.
        The caller was admitted (:meth:`admit`). ``start``: when the operation began, if
        before this call (its request was sent earlier; ``time.perf_counter()``)."""
        began = time.perf_counter()
        start = began if start is None else start
        try:
            faults.point(point)
            result = fn()
        except RemoteError as exc:
            # Raised by the engine on a reply it judged (oversize, corrupt): the server is up.
            self._done(op, start, exc.reason, sent, 0)
            raise
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # (a Rust client's panic is one: pyo3's PanicException)
            reason = self._classify(exc)
            if reason in ("error", "refused") and time.perf_counter() - began > self.settings.timeout_max_s:
                # (slow, whatever the client said at the end: a resolver, a TLS or AUTH
                # handshake that stalled; counted as the breaker counts timeouts. From this
                # call on: not the caller's own work since a request was sent earlier)
                reason = "timeout"
            detail = self._detail(exc)
            self._done(op, start, reason, sent, 0)
            logger.debug("remote %s %s failed: %s (%s)", self.engine, op, reason, detail)
            raise RemoteError(reason, op, detail, engine=self.engine) from None
        self._done(op, start, None, sent, received(result) if received is not None else 0)
        return result

    def _done(self, op: str, start: float, reason: Reason | None, sent: int, received: int) -> None:
        self.breaker.record(reason)
        if self._observer is None:
            return
        try:
            self._observer(op, time.perf_counter() - start, reason, sent, received)
        except Exception:
            logger.exception("remote operation observer failed")

    def _detail(self, exc: BaseException) -> str:
        said = self._describe(exc) if self._describe is not None else None
        text = said or f"{type(exc).__name__}: {exc}".replace("\n", " ")
        return self.settings.redact(text)[:_DETAIL_LIMIT]
