"""One-call OpenTelemetry SDK setup for applications and the CLI (extra ``otel``).

The library itself never configures the SDK; this module is for programs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["render_span_tree", "setup"]


@contextlib.contextmanager
def _needs(package: str, what: str) -> Iterator[None]:
    """An SDK package missing is a ConfigError naming it and the extra that brings it."""
    try:
        yield
    except ImportError as exc:
        raise ConfigError(
            f"{what} needs the {package} package: pip install 'safejit[otel]' (or {package}) [{exc.name}]"
        ) from exc


def setup(
    *,
    console: bool = False,
    otlp_endpoint: str | None = None,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    memory: bool = False,
    service_name: str = "safejit",
) -> Any:
    """Install an SDK tracer and meter provider.

    ``console`` prints spans; ``otlp_endpoint`` exports spans and metrics over
    OTLP/HTTP; ``prometheus_port`` serves ``/metrics``; ``memory`` keeps spans
    in an in-memory exporter, which is returned.

    OpenTelemetry keeps the providers installed first: a second call with the same
    settings returns what the first did (its exporter; no second ``/metrics`` server),
    one with other settings, or a call after a program installed providers of its own,
    is a :class:`ConfigError` (what it installed would receive nothing).
    """
    global _installed
    from opentelemetry import metrics, trace

    settings = {
        "console": console,
        "otlp_endpoint": otlp_endpoint,
        "prometheus_port": prometheus_port,
        "prometheus_addr": prometheus_addr,
        "memory": memory,
        "service_name": service_name,
    }
    with _lock:
        if _installed is not None:
            if _installed[0] != settings:
                raise ConfigError(
                    f"safejit.telemetry.setup was called already, with {_installed[0]}: OpenTelemetry keeps the "
                    "providers installed first, so other settings cannot take effect"
                )
            return _installed[1]
        exporter = _install(trace, metrics, **settings)  # type: ignore[arg-type]
        _installed = (settings, exporter)
        return exporter


_lock = threading.Lock()
#: The first call's settings and what it returned.
_installed: tuple[dict[str, Any], Any] | None = None


def _install(
    trace: Any,
    metrics: Any,
    *,
    console: bool,
    otlp_endpoint: str | None,
    prometheus_port: int | None,
    prometheus_addr: str,
    memory: bool,
    service_name: str,
) -> Any:
    # Every package needed first (a missing one is named, nothing installed or started).
    with _needs("opentelemetry-sdk", "safejit.telemetry.setup"):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    if otlp_endpoint:
        with _needs("opentelemetry-exporter-otlp-proto-http", "otlp_endpoint"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    if prometheus_port is not None:
        with _needs("opentelemetry-exporter-prometheus", "prometheus_port"):
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
    traces = memory or console or bool(otlp_endpoint)
    meters = bool(otlp_endpoint) or prometheus_port is not None
    # (what a program installed itself is kept by OpenTelemetry: one installed over it
    # would receive nothing; each provider is checked only where this call installs one)
    if traces and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        raise ConfigError(
            "an OpenTelemetry tracer provider is installed already: safejit.telemetry.setup would install "
            "one that receives nothing (add safejit's span exporters to the program's own provider instead)"
        )
    if meters and type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider":  # (the API's own)
        raise ConfigError(
            "an OpenTelemetry meter provider is installed already: safejit.telemetry.setup would install "
            "one that receives nothing (add a metric reader to the program's own provider instead)"
        )

    resource = Resource.create({"service.name": service_name})
    tracer_provider = TracerProvider(resource=resource)
    exporter = None
    if memory:
        exporter = InMemorySpanExporter()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    if console:
        tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    readers: list[MetricReader] = []
    if otlp_endpoint:
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint}/v1/traces")))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{otlp_endpoint}/v1/metrics")))
    if prometheus_port is not None:
        try:
            start_http_server(port=prometheus_port, addr=prometheus_addr)
        except OSError as exc:  # (before anything is installed: nothing to undo)
            raise ConfigError(
                f"prometheus_port: cannot serve /metrics on {prometheus_addr}:{prometheus_port}: {exc.strerror or exc}"
            ) from None
        readers.append(PrometheusMetricReader())
    if traces:
        trace.set_tracer_provider(tracer_provider)
    if readers:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    return exporter


def render_span_tree(spans: Sequence[Any]) -> str:
    """Finished spans as an indented tree with durations and key attributes."""
    by_parent: dict[int | None, list[Any]] = {}
    ids = {s.context.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_time):
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(s)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in by_parent.get(parent, []):
            ms = (s.end_time - s.start_time) / 1e6
            attrs = {
                k.removeprefix("safejit."): v
                for k, v in (s.attributes or {}).items()
                if k in ("safejit.tier", "safejit.result", "safejit.reason", "safejit.outcome", "error.type")
            }
            extra = " ".join(f"{k}={v}" for k, v in attrs.items())
            lines.append(f"{'  ' * depth}{s.name}  {ms:.2f} ms  {extra}".rstrip())
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)
