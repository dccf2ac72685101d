"""OpenTelemetry instrumentation: span and metric names (a contract), the
library's tracer and meter, and its instruments.

The library talks only to ``opentelemetry-api``: without an SDK every call is
a no-op. Applications (and the CLI) configure the SDK, e.g. with
:func:`safejit.telemetry.setup`::

    import safejit.telemetry
    safejit.telemetry.setup(console=True, prometheus_port=9464)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, Final, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, StatusCode

from .. import _forksafe
from .._version import __version__

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: A runtime's (hits, entries, bytes, attributes), for the memory observables.
_Source = Callable[[], Iterable[tuple[int, int, int, dict[str, str]]]]

__all__ = [
    "ATTR",
    "DURATION_BUCKETS",
    "METRIC",
    "SPAN",
    "in_this_context",
    "instruments",
    "mark_failed",
    "meter",
    "setup",
    "span",
    "tracer",
]


class SPAN:
    COMPILE: Final = "safejit.compile"
    KEY: Final = "safejit.key"
    MEMORY_LOOKUP: Final = "safejit.cache.memory.lookup"
    DISK_LOOKUP: Final = "safejit.cache.disk.lookup"
    VERIFY: Final = "safejit.verify"
    LOCK_WAIT: Final = "safejit.lock.wait"
    COMPILER_RUN: Final = "safejit.compiler.run"
    POLICY_CHECK: Final = "safejit.policy.check"
    PUBLISH: Final = "safejit.publish"
    LOAD: Final = "safejit.load"
    REMOTE_LOOKUP: Final = "safejit.cache.remote.lookup"
    REMOTE_FETCH: Final = "safejit.cache.remote.fetch"
    REMOTE_PUBLISH: Final = "safejit.cache.remote.publish"
    REMOTE_LEASE_WAIT: Final = "safejit.remote.lease.wait"


class METRIC:
    LOOKUPS: Final = "safejit.cache.lookups"
    COMPILE_DURATION: Final = "safejit.compile.duration"
    LOAD_DURATION: Final = "safejit.load.duration"
    VERIFY_DURATION: Final = "safejit.verify.duration"
    LOCK_WAIT_DURATION: Final = "safejit.lock.wait.duration"
    EVICTIONS: Final = "safejit.cache.evictions"
    POLICY_VIOLATIONS: Final = "safejit.policy.violations"
    PUBLISH_OUTCOMES: Final = "safejit.publish.outcomes"
    MEMORY_ENTRIES: Final = "safejit.cache.memory.entries"
    MEMORY_BYTES: Final = "safejit.cache.memory.bytes"
    MEMORY_HITS: Final = "safejit.cache.memory.hits"
    CACHE_BYPASS: Final = "safejit.cache.bypass"
    REMOTE_DURATION: Final = "safejit.remote.duration"
    REMOTE_BYTES: Final = "safejit.remote.bytes"
    REMOTE_BREAKER: Final = "safejit.remote.breaker.transitions"
    REMOTE_UPLOADS: Final = "safejit.remote.uploads"


class ATTR:
    BACKEND: Final = "safejit.backend"
    KERNEL: Final = "safejit.kernel"
    TIER: Final = "safejit.tier"
    RESULT: Final = "safejit.result"
    REASON: Final = "safejit.reason"
    BUILD_KEY: Final = "safejit.build_key"
    DEPS_KEY: Final = "safejit.deps_key"
    DEPS_COUNT: Final = "safejit.deps.count"
    BYTES: Final = "safejit.bytes"
    ROOT: Final = "safejit.root"
    SANDBOX: Final = "safejit.sandbox"
    KIND: Final = "safejit.kind"
    OUTCOME: Final = "safejit.outcome"
    TENANT: Final = "safejit.tenant"
    OP: Final = "safejit.remote.op"
    DIRECTION: Final = "safejit.direction"
    TO: Final = "safejit.to"
    ERROR_TYPE: Final = "error.type"
    REMOTE_ENGINE: Final = "safejit.remote.engine"


#: Seconds, 1 ms to 10 min.
DURATION_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)

tracer = trace.get_tracer("safejit", __version__)
meter = metrics.get_meter("safejit", __version__)


class _Instruments:
    """Created once at import; they bind to whatever provider the app installs."""

    def __init__(self) -> None:
        self.lookups = meter.create_counter(
            METRIC.LOOKUPS, unit="{lookup}", description="Cache lookups by tier and result"
        )
        self.compile_duration = self._histogram(METRIC.COMPILE_DURATION, "Compiler run time")
        self.load_duration = self._histogram(METRIC.LOAD_DURATION, "Artifact load time")
        self.verify_duration = self._histogram(METRIC.VERIFY_DURATION, "Leaf verification time")
        self.lock_wait_duration = self._histogram(METRIC.LOCK_WAIT_DURATION, "Build lock wait time")
        self.evictions = meter.create_counter(METRIC.EVICTIONS, unit="{entry}", description="Memory-tier evictions")
        self.policy_violations = meter.create_counter(
            METRIC.POLICY_VIOLATIONS, unit="{violation}", description="Requests refused by policy"
        )
        self.publish_outcomes = meter.create_counter(
            METRIC.PUBLISH_OUTCOMES, unit="{publish}", description="Publish outcomes"
        )
        self.bypass = meter.create_counter(
            METRIC.CACHE_BYPASS, unit="{compile}", description="Compiles that bypassed an unusable disk cache"
        )
        self.remote_duration = self._histogram(METRIC.REMOTE_DURATION, "Remote operation time, by operation")
        self.remote_bytes = meter.create_counter(
            METRIC.REMOTE_BYTES, unit="By", description="Bytes sent to and received from the remote"
        )
        self.breaker_transitions = meter.create_counter(
            METRIC.REMOTE_BREAKER, unit="{transition}", description="Remote circuit breaker state changes"
        )
        self.remote_uploads = meter.create_counter(
            METRIC.REMOTE_UPLOADS, unit="{leaf}", description="Remote uploads by outcome"
        )
        #: Each live runtime's source (by id; once let go, what it counted until folded in),
        #: the ids let go and not yet folded in, and the hits of those folded in, per
        #: attribute set (still in the counter's total).
        self._sources: dict[int, _Source | tuple[tuple[int, int, int, dict[str, str]], ...]] = {}
        self._leaving: list[int] = []
        self._retired_hits: dict[tuple[tuple[str, str], ...], int] = {}
        self._sources_lock = _forksafe.Lock()
        meter.create_observable_counter(
            METRIC.MEMORY_HITS,
            [self._observe_hits],
            unit="{lookup}",
            description="Memory-tier hits (counted without per-call telemetry)",
        )
        meter.create_observable_gauge(
            METRIC.MEMORY_ENTRIES, [self._observe_entries], unit="{entry}", description="Memory-tier entries"
        )
        meter.create_observable_gauge(
            METRIC.MEMORY_BYTES, [self._observe_bytes], unit="By", description="Memory-tier bytes"
        )

    def lookup(self, tier: str, result: str, reason: str, attrs: Mapping[str, str]) -> None:
        """Count one lookup of ``tier`` (``safejit.cache.lookups``)."""
        self.lookups.add(1, {**attrs, ATTR.TIER: tier, ATTR.RESULT: result, ATTR.REASON: reason})

    @staticmethod
    def _histogram(name: str, description: str):  # type: ignore[no-untyped-def]
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS)
        )

    def register(self, source: _Source) -> None:
        """Add a runtime's (hits, entries, bytes, attributes) source for the observables."""
        with self._sources_lock:
            self._settle()
            self._sources[id(source)] = source

    def unregister(self, source: _Source) -> None:
        """Let a runtime's source go; its hits stay in the hits counter's total (a monotonic
        counter never goes down: a closed runtime's hits would read as a reset). Never
        waits: this runs from finalizers (within a collection, on whatever thread, maybe
        the one reading the observables) and from ``close()`` in a signal handler. The
        source is swapped at once for what it counted (one dict item: atomic), so nothing
        of its runtime is kept; the next holder of the lock folds that into the totals."""
        key = id(source)
        if self._sources.get(key) is not source:
            return  # (let go already: close(), then the finalizer)
        self._sources[key] = tuple((hits, 0, 0, attrs) for hits, _, _, attrs in source())
        self._leaving.append(key)
        if self._sources_lock.acquire(blocking=False):
            try:
                self._settle()
            finally:
                self._sources_lock.release()

    def _settle(self) -> None:
        """Under the lock: fold the counts of the sources let go into the totals (each once)."""
        while self._leaving:
            key = self._leaving.pop()
            counted = self._sources.get(key)
            if not isinstance(counted, tuple):
                continue
            del self._sources[key]
            for hits, _, _, attrs in counted:
                name = tuple(sorted(attrs.items()))
                self._retired_hits[name] = self._retired_hits.get(name, 0) + hits

    def _observe(self, index: int) -> list[Observation]:
        with self._sources_lock:
            self._settle()
            sources = list(self._sources.values())
            totals: dict[tuple[tuple[str, str], ...], int] = dict(self._retired_hits) if index == 0 else {}
            for source in sources:  # (a source reads a few ints: nothing that waits)
                for hits, entries, size, attrs in source if isinstance(source, tuple) else source():
                    key = tuple(sorted(attrs.items()))
                    totals[key] = totals.get(key, 0) + (hits, entries, size)[index]
        return [Observation(v, dict(k)) for k, v in totals.items()]

    def _after_fork_in_child(self) -> None:
        """A forked child counts its own hits: its memory tiers start at 0, and the runtimes
        its parent had let go are not its own."""
        self._retired_hits = {}

    def _observe_hits(self, options: CallbackOptions) -> list[Observation]:
        return self._observe(0)

    def _observe_entries(self, options: CallbackOptions) -> list[Observation]:
        return self._observe(1)

    def _observe_bytes(self, options: CallbackOptions) -> list[Observation]:
        return self._observe(2)


instruments = _Instruments()
os.register_at_fork(after_in_child=instruments._after_fork_in_child)


def in_this_context(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, to be run on another thread within this thread's trace context now: the
    spans it opens are children of the span current here (work handed to the background)."""
    now = otel_context.get_current()

    def run(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(now)
        try:
            return fn(*args, **kwargs)
        finally:
            with suppress(Exception):
                otel_context.detach(token)

    return run


def mark_failed(s: Span, error_type: str, description: str = "") -> None:
    """Mark ``s`` failed as a span whose block raised is (status ERROR, ``error.type``),
    for work that failed without raising (a remote failure turned into a miss)."""
    with suppress(Exception):
        s.set_status(StatusCode.ERROR, description or None)
        s.set_attribute(ATTR.ERROR_TYPE, error_type)


@contextmanager
def span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[Span]:
    """A current span that also sets ``error.type`` when the block raises.

    With no tracer provider installed, nothing could record it: the API's no-op
    span is yielded without being made current (8 µs less per span; a cold
    compile opens about ten)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield trace.INVALID_SPAN
        return
    # The SDK passes on what a span processor or sampler raises, at the span's start and
    # end: telemetry must never break the work it observes, so that is logged and dropped.
    opened = tracer.start_as_current_span(name, attributes=attributes)
    try:
        current = opened.__enter__()
    except Exception:
        _telemetry_failed(name)
        yield trace.INVALID_SPAN
        return
    try:
        yield current
    except BaseException as exc:
        with suppress(Exception):
            current.set_attribute(ATTR.ERROR_TYPE, type(exc).__qualname__)
        try:
            opened.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as failed:
            if failed is not exc:
                _telemetry_failed(name)
        raise
    try:
        opened.__exit__(None, None, None)
    except Exception:
        _telemetry_failed(name)


_failed_before = False


def _telemetry_failed(name: str) -> None:
    """Say once per process, at WARNING, that a span could not be started or ended (the
    next ones at DEBUG: a broken processor fails every span)."""
    global _failed_before
    level = logging.DEBUG if _failed_before else logging.WARNING
    _failed_before = True
    logger.log(level, "the span %s could not be started or ended (a span processor failed)", name, exc_info=True)


def setup(
    *,
    console: bool = False,
    otlp_endpoint: str | None = None,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    memory: bool = False,
    service_name: str = "safejit",
) -> Any:
    """Install the OpenTelemetry SDK for an application (needs ``safejit[otel]``).

    The library never calls this itself. ``console`` prints spans,
    ``otlp_endpoint`` exports over OTLP/HTTP, ``prometheus_port`` serves
    ``/metrics`` on ``prometheus_addr``, ``memory`` keeps spans in an
    in-memory exporter, which is returned.
    """
    from ._sdk import setup as _setup

    return _setup(
        console=console,
        otlp_endpoint=otlp_endpoint,
        prometheus_port=prometheus_port,
        prometheus_addr=prometheus_addr,
        memory=memory,
        service_name=service_name,
    )
