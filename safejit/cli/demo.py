"""``safejit demo``: the main job, end to end on the host backend."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

from ..cache.fsio import remove_tree
from ..cache.layout import VERSION
from ..runtime import Runtime
from ..spec import Source
from ._common import config_for, console

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


def _demo_compile(rt: Runtime, nonce: str) -> tuple[float, Any]:
    started = time.perf_counter()
    mod = rt.compile(Source(DEMO_SOURCE, "demo"), defines={"SAFEJIT_DEMO_RUN": nonce})
    dot = mod.kernel("dot", argtypes=(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), restype=ctypes.c_double)
    return time.perf_counter() - started, (mod, dot)


def cmd_demo_child(args: argparse.Namespace) -> int:
    rt = Runtime(config=config_for(args.cache_dir))
    seconds, (mod, dot) = _demo_compile(rt, args.nonce)
    n = 100
    x = (ctypes.c_double * n)(*range(n))
    print(json.dumps({"seconds": seconds, "tier": mod.artifact.source, "dot": dot(x, x, n), "stats": dict(rt.stats())}))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    exporter = None
    if args.trace:
        from ..telemetry import setup

        exporter = setup(memory=True)
    cfg = config_for(args.cache_dir)
    rt = Runtime(config=cfg)
    nonce = uuid.uuid4().hex[:16]
    console.print("[bold]safejit demo[/] — host backend, kernel [cyan]saxpy[/]/[cyan]dot[/]")
    cold, (mod, dot) = _demo_compile(rt, nonce)
    leaf = mod.artifact.path
    console.print(f"  cache root      {cfg.resolved_cache_dirs()[0]}")
    console.print(f"  cold compile    {cold * 1e3:9.1f} ms   ({mod.artifact.source}; leaf {_short(leaf)})")
    hits = []
    for _ in range(1000):
        t0 = time.perf_counter()
        rt.compile(Source(DEMO_SOURCE, "demo"), defines={"SAFEJIT_DEMO_RUN": nonce})
        hits.append(time.perf_counter() - t0)
    hits.sort()
    console.print(f"  memory hit      {hits[len(hits) // 2] * 1e6:9.2f} µs   (p50 of 1000 calls)")
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "safejit",
            "_demo-child",
            nonce,
            *(["--cache-dir", args.cache_dir] if args.cache_dir else []),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if child.returncode != 0:
        console.print(f"[red]fresh process failed[/]: {child.stderr.strip()}")
        return 1
    report = json.loads(child.stdout.strip().splitlines()[-1])
    console.print(
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
    console.print(f"  saxpy check     sum(2x+1) = {got:.1f} (expected {expected:.1f}); dot(x,x) = {dot(x, x, n):.1f}")
    console.print(f"  stats           {dict(rt.stats())}")
    if exporter is not None:
        from ..telemetry._sdk import render_span_tree

        console.print(render_span_tree(exporter.get_finished_spans()))
    rt.close()
    if not args.keep and leaf:
        _remove_build(leaf)
    ok = got == expected and report["tier"] == "disk" and report["stats"]["compiles"] == 0
    console.print("[green]demo ok[/]" if ok else "[red]demo failed[/]")
    return 0 if ok else 1


def _remove_build(leaf: str) -> None:
    """Remove the demo's own build directory (its nonce makes it unique)."""
    build = os.path.dirname(leaf)
    root = build.split(f"/{VERSION}/")[0]
    try:
        remove_tree(build, within=os.path.join(root, VERSION))
    except OSError as exc:
        console.print(f"[yellow]could not remove demo entry {build}: {exc}[/]")


def _short(path: str) -> str:
    return "…/" + "/".join(path.split("/")[-2:]) if path else "(not cached)"
