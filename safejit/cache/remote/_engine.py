"""What the two engines share: their identity and breaker, the one :class:`Guard` every
operation crosses, a client per deadline class (made on first use), and the size checks
on blobs made before anything is sent."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import ClassVar, Generic, TypeVar

from ._guard import Guard
from .breaker import Breaker, Transition
from .layout import Layout
from .settings import RemoteSettings
from .store import OpObserver, Reason, RemoteError

__all__ = ["Engine"]

C = TypeVar("C")


class Engine(Generic[C]):
    """The base of an engine whose client (``C``) is fixed per deadline class."""

    engine: ClassVar[str]

    def __init__(
        self,
        settings: RemoteSettings,
        *,
        tenant: str,
        backend: str,
        breaker: Breaker | None = None,
        on_transition: Transition | None = None,
        observer: OpObserver | None = None,
    ) -> None:
        self._open(settings)
        self.settings = settings
        self.layout = Layout(tenant, backend)
        self.tenant = tenant
        self.backend = backend
        self.breaker = breaker or Breaker(settings.breaker, on_transition=on_transition)
        self._guard = Guard(self.engine, settings, self.breaker, self._classify, observer, self._describe)
        self._lock = threading.Lock()
        self._pools: dict[float, C] = {}
        #: Lease releases under way: close() lets them end first (:meth:`_drop_pools`).
        self._releases = 0
        self._released = threading.Condition(self._lock)

    def _open(self, settings: RemoteSettings) -> None:
        """Check that ``settings`` are for this engine and import its client library: a
        ConfigError (naming the extra to install) before anything else is made."""
        raise NotImplementedError

    @staticmethod
    def _classify(exc: BaseException) -> Reason:
        """The reason for an exception of the engine's client library."""
        raise NotImplementedError

    def _describe(self, exc: BaseException) -> str | None:
        """What an exception of the engine's client library means, in words, where its own
        text buries it (None: its text, redacted and cut)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings.url}, tenant={self.tenant!r}, backend={self.backend!r})"

    def _pooled(self, nbytes: int, make: Callable[[float], C]) -> C:
        """The client for the deadline class of an ``nbytes`` transfer, made by ``make``
        (given that deadline) the first time it is asked for; none once the store is
        closed (a compile still running then gets a miss, not a connection made again)."""
        bucket = self.settings.deadline_class(nbytes)
        found = self._pools.get(bucket)
        if found is not None:
            return found
        with self._lock:
            if self._guard.closed:
                raise RemoteError("error", "connect", "the store is closed", engine=self.engine)
            found = self._pools.get(bucket)
            if found is None:
                found = self._pools[bucket] = make(bucket)
        return found

    @contextlib.contextmanager
    def _releasing(
        self, pooled: Callable[[], C], fresh: Callable[[float], C], drop: Callable[[C], None]
    ) -> Iterator[C]:
        """The client to let a lease go with: the pooled one; on a closed store (a compile
        that ended after its node closed), one made for this call alone (``fresh``) and
        dropped after it — other nodes then need not wait out the lease's TTL. A release
        under way when close() is called ends before close() disconnects its client."""
        with self._lock:
            self._releases += 1
        try:
            client = None
            if not self._guard.closed:
                with contextlib.suppress(RemoteError):  # (closed meanwhile)
                    client = pooled()
            if client is not None:
                yield client
                return
            client = fresh(self.settings.deadline_class(0))
            try:
                yield client
            finally:
                drop(client)
        finally:
            with self._lock:
                self._releases -= 1
                self._released.notify_all()

    def _drop_pools(self) -> list[C]:
        """Close the store for good: forget every client made so far (the caller closes
        them) and make no more — once the lease releases under way have ended (at most an
        operation's deadline: one cut off would leave its lease to expire, and other nodes
        to wait out its TTL)."""
        with self._lock:
            self._guard.closed = True
            self._released.wait_for(lambda: not self._releases, timeout=self.settings.deadline(0))
            clients, self._pools = list(self._pools.values()), {}
        return clients

    def _read_cap(self, size: int | None) -> int:
        """The most bytes a blob read may return: ``size`` when given, never over ``max_bytes``."""
        cap = self.settings.max_bytes if size is None else size
        if cap > self.settings.max_bytes or cap < 0:
            raise RemoteError("oversize", "get_blob", f"{cap} bytes > {self.settings.max_bytes}", engine=self.engine)
        return cap

    def _check_put_size(self, data: bytes) -> None:
        if len(data) > self.settings.max_bytes:
            raise RemoteError(
                "oversize", "put_blob", f"{len(data)} bytes > {self.settings.max_bytes}", engine=self.engine
            )

    def _check_manifest_size(self, manifest: bytes) -> None:
        if len(manifest) > self.settings.max_manifest_bytes:
            raise RemoteError("oversize", "publish", f"manifest of {len(manifest)} bytes", engine=self.engine)
