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
