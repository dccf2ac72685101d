"""The Prometheus endpoint, scraped over HTTP on 127.0.0.1 (in a child process:
an SDK meter provider can be installed only once per process)."""

from __future__ import annotations

import socket
import subprocess
import sys

SCRIPT = r"""
import sys, urllib.request
import safejit, safejit.telemetry
port = int(sys.argv[1])
safejit.telemetry.setup(prometheus_port=port)
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[2],)))
rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"))
rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"))
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_endpoint_serves_the_contract_names(cache_dir):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(_free_port()), str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert any(line.startswith("safejit_cache_lookups_total{") for line in lines)
    assert any(line.startswith("safejit_compile_duration_seconds_bucket{") and 'le="0.001"' in line for line in lines)
    assert any(line.startswith("safejit_cache_memory_hits_total{") and line.endswith(" 1.0") for line in lines)


OWN_PROVIDERS = r"""
import sys, urllib.request
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
import safejit, safejit.telemetry
port, own = int(sys.argv[1]), sys.argv[3]
(trace.set_tracer_provider if own == "tracer" else metrics.set_meter_provider)(
    TracerProvider() if own == "tracer" else MeterProvider()
)
try:
    safejit.telemetry.setup(prometheus_port=port)
except safejit.ConfigError as exc:
    print("refused:", exc)
    raise SystemExit(0)
again = safejit.telemetry.setup(prometheus_port=port)  # (the same settings: what the first did)
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[2],)))
rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"))
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""


def test_setup_for_metrics_keeps_a_programs_own_tracer_and_refuses_over_its_own_meter(cache_dir):
    """Each provider is checked where setup installs one: a program with a tracer provider of
    its own still gets /metrics (it was refused); one with its own meter provider is told
    (setup installed a reader that received nothing, silently)."""
    runs = {}
    for own in ("tracer", "meter"):
        runs[own] = subprocess.run(
            [sys.executable, "-c", OWN_PROVIDERS, str(_free_port()), str(cache_dir), own],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    assert any(line.startswith("safejit_cache_lookups_total{") for line in runs["tracer"].splitlines())
    assert runs["meter"].startswith("refused: an OpenTelemetry meter provider is installed already")


TAKEN = r"""
import socket, sys
from opentelemetry import metrics
import safejit, safejit.telemetry
with socket.socket() as held:
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        safejit.telemetry.setup(prometheus_port=held.getsockname()[1])
    except safejit.ConfigError as exc:
        print("refused:", exc)
print("installed:", type(metrics.get_meter_provider()).__name__)
"""


def test_a_prometheus_port_in_use_is_a_config_error_and_installs_nothing():
    out = subprocess.run(
        [sys.executable, "-c", TAKEN], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out[0].startswith("refused: prometheus_port: cannot serve /metrics on 127.0.0.1:"), out
    assert out[1] == "installed: _ProxyMeterProvider", out
