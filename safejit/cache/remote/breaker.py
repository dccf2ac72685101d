"""The circuit breaker in front of a remote: it opens on failures, lets one probe
through every ``probe_interval_s`` while open, and closes again when a probe succeeds.

Trips on a failure rate (>= ``failure_ratio`` of at least ``min_calls`` calls within
``window_s``) or on ``consecutive_timeouts`` timeouts in a row. Only availability
failures count (``timeout``, ``refused``, ``error``): an answer such as ``denied`` or
``oversize`` shows the server is up. While open, :meth:`Breaker.allow` costs an
attribute read and a clock read, so a lookup skips a dead remote for about a branch.

>>> b = Breaker(BreakerPolicy(consecutive_timeouts=1))
>>> b.allow(), b.record("timeout"), b.allow(), b.state
(True, None, False, 'open')
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from ...errors import ConfigError

__all__ = ["FAILURES", "Breaker", "BreakerPolicy", "State"]

logger = logging.getLogger(__name__)

State = Literal["closed", "open", "half_open"]
#: The reasons that count as the remote being unavailable.
FAILURES: Final = frozenset({"timeout", "refused", "error"})
#: Called as ``on_transition(old_state, new_state)`` (the ``safejit.remote.breaker.transitions{to}``
#: metric); called outside the breaker's lock, and its exceptions are logged, never raised.
Transition = Callable[[State, State], None]


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    window_s: float = 30.0
    min_calls: int = 10
    failure_ratio: float = 0.5
    consecutive_timeouts: int = 3
    #: While open, one call per this many seconds (per process) probes the remote.
    probe_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.probe_interval_s > 0):
            raise ConfigError("breaker window_s and probe_interval_s must be positive")
        if self.min_calls < 1 or self.consecutive_timeouts < 1:
            raise ConfigError("breaker min_calls and consecutive_timeouts must be at least 1")
        if not 0.0 < self.failure_ratio <= 1.0:
            raise ConfigError("breaker failure_ratio must be in (0, 1]")


_BUCKETS: Final = 30  # the window is kept as this many (time slot, calls, failures) buckets


class Breaker:
    """Thread-safe; :meth:`allow` before a call, :meth:`record` after it (with the failure
    reason, or ``None`` on success). A caller that got ``True`` from :meth:`allow` while the
    breaker was open holds the probe and must record its outcome."""

    def __init__(
        self,
        policy: BreakerPolicy | None = None,
        *,
        on_transition: Transition | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or BreakerPolicy()
        self._on_transition = on_transition
        self._clock = clock
        self._lock = threading.Lock()
        #: Read-only for callers: ``state == "closed"``, as a plain attribute (the fast path).
        self.closed = True
        self._state: State = "closed"
        self._next_probe = 0.0
        self._probing = False
        self._timeouts = 0
        self._slot = self.policy.window_s / _BUCKETS
        self._window: deque[list[int]] = deque()  # [slot index, calls, failures]
        self.transitions = 0

    @property
    def state(self) -> State:
        return self._state

    def allow(self) -> bool:
        """May a call go to the remote now? Closed: yes. Open: only the probe, at most one
        per ``probe_interval_s``."""
        if self.closed:
            return True
        if self._clock() < self._next_probe:
            return False
        return self._take_probe()

    def _take_probe(self) -> bool:
        with self._lock:
            now = self._clock()
            if self._state == "closed":
                return True
            if now < self._next_probe:
                return False
            # A probe whose caller never recorded an outcome expires after one interval.
            self._next_probe = now + self.policy.probe_interval_s
            self._probing = True
            fired = self._move("half_open")
        self._notify(fired)
        return True

    def record(self, reason: str | None) -> None:
        """The outcome of a call that :meth:`allow` let through: ``None`` (or any reason not
        in :data:`FAILURES`) is a success."""
        failed = reason in FAILURES
        with self._lock:
            if self._state != "closed":
                fired = self._probe_outcome(failed)
            else:
                fired = self._count(failed, reason == "timeout")
        self._notify(fired)

    def _probe_outcome(self, failed: bool) -> tuple[State, State] | None:
        if not self._probing:
            return None  # a call that started before the breaker opened: its outcome is old news
        self._probing = False
        if failed:
            self._next_probe = self._clock() + self.policy.probe_interval_s
            return self._move("open")
        self._window.clear()
        self._timeouts = 0
        return self._move("closed")

    def _count(self, failed: bool, timeout: bool) -> tuple[State, State] | None:
        now = self._clock()
        slot = int(now / self._slot)
        window = self._window
        while window and window[0][0] <= slot - _BUCKETS:
            window.popleft()
        if not window or window[-1][0] != slot:
            window.append([slot, 0, 0])
        window[-1][1] += 1
        window[-1][2] += failed
        self._timeouts = self._timeouts + 1 if timeout else 0
        if not failed:
            return None
        calls = sum(b[1] for b in window)
        failures = sum(b[2] for b in window)
        policy = self.policy
        tripped = self._timeouts >= policy.consecutive_timeouts or (
            calls >= policy.min_calls and failures >= policy.failure_ratio * calls
        )
        if not tripped:
            return None
        self._next_probe = now + policy.probe_interval_s
        self._window.clear()
        self._timeouts = 0
        return self._move("open")

    def _move(self, new: State) -> tuple[State, State] | None:
        old = self._state
        if old == new:
            return None
        self._state = new
        self.closed = new == "closed"
        self.transitions += 1
        return (old, new)

    def _notify(self, fired: tuple[State, State] | None) -> None:
        if fired is None:
            return
        logger.info("remote circuit breaker %s -> %s", fired[0], fired[1])
        if self._on_transition is not None:
            try:
                self._on_transition(*fired)
            except Exception:
                logger.exception("remote circuit breaker transition callback failed")

    def __repr__(self) -> str:
        return f"Breaker(state={self._state!r}, policy={self.policy!r})"
