"""Keeping a build lease alive while its holder compiles: a heartbeat thread renews it
every third of its TTL, reports when it was lost, and releases it at the end.

A lease is for efficiency only (one compile per fleet); losing one costs at most a
duplicate compile. So the keeper never raises: a renewal the remote refused, or one
that failed for longer than the TTL, marks the lease lost and stops the heartbeat.

>>> lease = store.acquire_lease(build_key, holder=node_id)          # doctest: +SKIP
>>> with LeaseKeeper(store, lease) as keeper:                       # doctest: +SKIP
...     compile_and_publish()
...     keeper.lost                                                  # True if another node took over
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from .store import Lease, RemoteError, RemoteStore

__all__ = ["LeaseKeeper"]

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews ``lease`` on ``store`` every ``interval_s`` (default: a third of its TTL) until
    :meth:`stop`, which releases it. ``on_lost()`` is called once, from the heartbeat thread,
    if the lease is lost."""

    def __init__(
        self,
        store: RemoteStore,
        lease: Lease,
        *,
        interval_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self.interval_s = lease.ttl_s / 3 if interval_s is None else interval_s
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._valid_until = time.monotonic() + lease.ttl_s

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def start(self) -> LeaseKeeper:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="safejit-lease", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = time.monotonic()
            try:
                held = self.store.renew_lease(self.lease)
            except Exception as exc:  # (whatever it is, the heartbeat goes on: never a thread ended silently)
                if not isinstance(exc, RemoteError):
                    logger.exception("remote lease renewal raised")
                if time.monotonic() < self._valid_until:
                    logger.debug("remote lease renewal failed (%s); retrying", getattr(exc, "reason", exc))
                    continue
                held = False
            if not held:
                self._mark_lost()
                return
            self._valid_until = started + self.lease.ttl_s

    def _mark_lost(self) -> None:
        self._lost.set()
        logger.info("remote lease on %s was lost", self.lease.build_key[:16])
        if self._on_lost is not None:
            try:
                self._on_lost()
            except Exception:
                logger.exception("remote lease on_lost callback failed")

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing and (unless ``release=False`` or it was lost) give the lease up."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if release and not self.lost:
            try:
                self.store.release_lease(self.lease)
            except RemoteError as exc:  # it expires on its own
                logger.debug("remote lease release failed (%s)", exc.reason)
            except Exception:  # (never out of stop(): it runs in the upload worker and at close)
                logger.exception("remote lease release raised; it expires on its own")

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
