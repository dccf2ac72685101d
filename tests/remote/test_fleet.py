"""One compile per fleet: processes standing for nodes (each its own disk root), one
Valkey. Cold together, exactly one compiles; the lease holder killed mid-compile,
exactly one more does (after its lease expires), and every node gets the kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys
import safejit
cache, root = sys.argv[1], sys.argv[2]
rt = safejit.Runtime(config=safejit.Config.from_env(cache_dirs=(cache,), source_roots=(root,), backend="fake"))
mod = rt.compile(safejit.Source('#include "inner.h"\n', "k"), include_dirs=(root + "/include",))
value = mod.kernel("INNER")()
rt._init()[0].remote.flush()
print(json.dumps({"compiles": rt.stats()["compiles"], "tier": str(mod.artifact.tier), "value": value}))
rt.close()
"""


def _start(tmp_path: Path, project: Path, url: str, n: int, delay: float, ttl: float) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env.update(
        SAFEJIT_REMOTE=url,
        SAFEJIT_REMOTE_LEASE_TTL_S=str(ttl),
        SAFEJIT_FAULTS=f"compiler.spawn=delay:{delay}",
    )
    return [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / f"node-{i}"), str(project)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def _results(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode == -signal.SIGKILL:
            continue
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_eight_nodes_cold_together_compile_once(tmp_path, project, redis_server):
    procs = _start(tmp_path, project, redis_server.url, 8, delay=1.0, ttl=10)
    results = _results(procs)
    assert [r["value"] for r in results] == [41] * 8
    assert sum(r["compiles"] for r in results) == 1
    assert sorted(r["tier"] for r in results).count("remote") == 7


def test_the_lease_holder_killed_mid_compile_costs_exactly_one_more_compile(tmp_path, project, redis_server):
    admin = redis_server.admin()
    procs = _start(tmp_path, project, redis_server.url, 8, delay=2.0, ttl=1.0)
    try:
        deadline = time.monotonic() + 60
        holder = None
        while time.monotonic() < deadline and holder is None:
            leases = admin.keys("sj:v1:default:fake:lease:*")
            if leases:
                token = admin.get(leases[0])
                holder = int(token.decode().split(":")[1]) if token else None
            time.sleep(0.01)
        assert holder is not None, "no node took the lease"
        os.kill(holder, signal.SIGKILL)  # mid-compile: its compile takes 2 s
        results = _results(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(results) == 7 and [r["value"] for r in results] == [41] * 7
    assert sum(r["compiles"] for r in results) == 1  # the one that took over; the rest got its leaf
