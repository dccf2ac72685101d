"""``safejit demo``: the main job, end to end on the host backend."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

from ..cache import maintenance
from ..cache.fsio import remove_tree
from ..cache.layout import VERSION
from ..runtime import Runtime
from ..spec import Source
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, config_for
from ._out import Out

__all__ = ["COUNTER_MEANINGS", "cmd_demo", "demo_child"]

DEMO_SOURCE = r"""
#include <stddef.h>

/* y <- a*x + y, returns the number of elements written */
int saxpy(double a, const double *x, double *y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
    return (int)n;
}

double dot(const double *x, const double *y, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += x[i] * y[i];
    return s;
}
"""

#: What each ``Runtime.stats()`` counter means (the demo's table; docs/observability.md).
COUNTER_MEANINGS: Final = {
    "compiles": "kernels this process compiled",
    "memory_hits": "calls answered from memory",
    "disk_hits": "found on disk, verified, loaded",
    "misses": "not on disk: compiled (or waited for)",
    "published": "leaves this process wrote to disk",
    "adopted": "another process published first; used theirs",
    "not_published": "built, not cached (inputs moved meanwhile)",
    "stale": "memory entries whose dependencies changed",
    "bypass": "compiled privately: the cache was unusable",
    "errors": "compiles that failed",
    "evictions": "memory entries dropped for room",
    "memory_entries": "kernels held in memory now",
    "memory_bytes": "bytes they hold (kernels, and what each keeps to revalidate)",
    "remote_hits": "found in the remote tier, verified here",
}


def _demo_compile(rt: Runtime, nonce: str) -> tuple[float, Any]:
    started = time.perf_counter()
    mod = rt.compile(Source(DEMO_SOURCE, "demo"), defines={"SAFEJIT_DEMO_RUN": nonce})
    dot = mod.kernel("dot", argtypes=(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), restype=ctypes.c_double)
    return time.perf_counter() - started, (mod, dot)


def demo_child(nonce: str, cache_dir: str | None) -> None:
    """The demo's fresh process (``python -m safejit.cli._demo_child``): the same
    compile, a disk hit now; what it saw, as one JSON line."""
    rt = Runtime(config=config_for(cache_dir))
    seconds, (mod, dot) = _demo_compile(rt, nonce)
    n = 100
    x = (ctypes.c_double * n)(*range(n))
    print(json.dumps({"seconds": seconds, "tier": mod.artifact.tier, "dot": dot(x, x, n), "stats": dict(rt.stats())}))


def _tracing(enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from ..telemetry import setup

        return setup(memory=True)
    except ImportError:
        raise CliError("--trace needs the OpenTelemetry SDK: pip install 'safejit[otel]'") from None


def cmd_demo(args: argparse.Namespace, out: Out) -> int:
    exporter = _tracing(args.trace)
    cfg = config_for(args.cache_dir)
    rt = Runtime(config=cfg)
    nonce = uuid.uuid4().hex[:16]
    out.line(("safejit demo", "bold"), ": host backend, kernels saxpy and dot (new on each run)")
    out.line(f"  cache root      {cfg.resolved_cache_dirs()[0]}")
    with out.status("compiling the demo kernel"):
        cold, (mod, dot) = _demo_compile(rt, nonce)
    leaf = mod.artifact.path
    out.line(f"  cold compile    {cold * 1e3:9.1f} ms   ({mod.artifact.tier})")
    out.line(("                  (a first run also probes the compiler, builds the sandbox)", "dim"))
    hits = []
    for _ in range(1000):
        t0 = time.perf_counter()
        rt.compile(Source(DEMO_SOURCE, "demo"), defines={"SAFEJIT_DEMO_RUN": nonce})
        hits.append(time.perf_counter() - t0)
    hits.sort()
    out.line(f"  memory hit      {hits[len(hits) // 2] * 1e6:9.2f} µs   (p50 of 1000 calls)")
    with out.status("loading it in a fresh process"):
        report = _child(nonce, args.cache_dir)
    if report is None or not isinstance(report.get("stats"), dict):
        out.error("the fresh process failed", *(report or {}).get("stderr", "").splitlines()[-5:])
        return EXIT_FINDINGS
    out.line(
        f"  fresh process   {report['seconds'] * 1e3:9.2f} ms   ({report['tier']} hit, verified;"
        f" compiles there: {report['stats']['compiles']})"
    )
    n = 100
    x = (ctypes.c_double * n)(*range(n))
    y = (ctypes.c_double * n)(*([1.0] * n))
    saxpy = mod.kernel("saxpy", argtypes=(ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t))
    saxpy(2.0, x, y, n)
    expected = sum(2.0 * i + 1.0 for i in range(n))
    got = sum(y)
    out.line(f"  saxpy check     sum(2x+1) = {got:.1f} (expected {expected:.1f}); dot(x,x) = {dot(x, x, n):.1f}")
    _stats_table(out, rt.stats())
    if exporter is not None:
        from ..telemetry._sdk import render_span_tree

        for line in render_span_tree(exporter.get_finished_spans()).splitlines():
            out.line(line)
    rt.close()
    _leaf_note(out, leaf, keep=args.keep)
    ok = got == expected and report["tier"] == "disk" and report["stats"]["compiles"] == 0
    out.line(("demo ok", "ok") if ok else ("demo failed", "bad"))
    return EXIT_OK if ok else EXIT_FINDINGS


def _child(nonce: str, cache_dir: str | None) -> dict[str, Any] | None:
    argv = [sys.executable, "-m", "safejit.cli._demo_child", nonce, *([cache_dir] if cache_dir else [])]
    try:
        child = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"stderr": str(exc)}
    lines = child.stdout.strip().splitlines()
    with contextlib.suppress(ValueError, IndexError):
        report = json.loads(lines[-1])
        if child.returncode == 0 and isinstance(report, dict):
            return report
    return {"stderr": child.stderr}


def _stats_table(out: Out, stats: Mapping[str, int]) -> None:
    rows = [(name, f"{stats[name]:,}", meaning) for name, meaning in COUNTER_MEANINGS.items() if name in stats]
    rows += [(name, f"{value:,}", "") for name, value in stats.items() if name not in COUNTER_MEANINGS]
    out.table(("COUNTER", "VALUE", "MEANING"), rows, title="this process's Runtime.stats()", right={1}, shrink={2})


def _leaf_note(out: Out, leaf: str, *, keep: bool) -> None:
    if not leaf:
        return
    build = os.path.dirname(leaf)
    leaf_id = maintenance.leaf_id(os.path.basename(build)[6:], os.path.basename(leaf)[5:])
    if keep:
        out.line(f"  leaf kept       {leaf_id}  (see: safejit inspect ID; --no-keep removes it)")
        out.line(f"                  {leaf}")
        return
    root = build.split(f"/{VERSION}/")[0]
    try:
        remove_tree(build, within=os.path.join(root, VERSION))
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(build))  # its shard dir, when now empty
    except OSError as exc:
        out.line((f"  could not remove the demo's leaf {build}: {exc}", "warn"))
        return
    out.line(f"  leaf removed    {leaf_id} (--no-keep)")
