"""The ``safejit`` command: demo, ls, stats, verify."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from .cache import maintenance
from .cache.disk import LAYOUT
from .cache.fsio import remove_tree
from .cache.usage import read_usage
from .config import Config
from .errors import SafejitError
from .runtime import Runtime
from .spec import Source

__all__ = ["main"]

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

console = Console(highlight=False)


def _config(cache_dir: str | None) -> Config:
    cfg = Config.from_env()
    return cfg.replace(cache_dirs=(cache_dir,)) if cache_dir else cfg


def _demo_compile(rt: Runtime, nonce: str) -> tuple[float, Any]:
    started = time.perf_counter()
    mod = rt.compile(Source(DEMO_SOURCE, "demo"), defines={"SAFEJIT_DEMO_RUN": nonce})
    dot = mod.kernel("dot", argtypes=(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), restype=ctypes.c_double)
    return time.perf_counter() - started, (mod, dot)


def _cmd_demo_child(args: argparse.Namespace) -> int:
    rt = Runtime(config=_config(args.cache_dir))
    seconds, (mod, dot) = _demo_compile(rt, args.nonce)
    n = 100
    x = (ctypes.c_double * n)(*range(n))
    print(json.dumps({"seconds": seconds, "tier": mod.artifact.source, "dot": dot(x, x, n), "stats": dict(rt.stats())}))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    exporter = None
    if args.trace:
        from .telemetry import setup

        exporter = setup(memory=True)
    cfg = _config(args.cache_dir)
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
        from .telemetry._sdk import render_span_tree

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
    root = build.split(f"/{LAYOUT}/")[0]
    try:
        remove_tree(build, within=os.path.join(root, LAYOUT))
    except OSError as exc:
        console.print(f"[yellow]could not remove demo entry {build}: {exc}[/]")


def _short(path: str) -> str:
    return "…/" + "/".join(path.split("/")[-2:]) if path else "(not cached)"


def _roots(args: argparse.Namespace) -> tuple[str, ...]:
    return (args.cache_dir,) if args.cache_dir else Config.from_env().resolved_cache_dirs()


def _cmd_ls(args: argparse.Namespace) -> int:
    table = Table("tenant", "backend", "build key", "deps key", "bytes", "age", title="safejit cache")
    count = 0
    for root in _roots(args):
        for info in maintenance.iter_leaves(root):
            count += 1
            table.add_row(
                info.tenant,
                info.backend,
                info.build_key[:16],
                info.deps_key[:16],
                f"{info.size:,}",
                _age(time.time() - info.mtime),
            )
    console.print(table)
    console.print(f"{count} leaves")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    size = Table("root", "tenant", "backend", "leaves", "bytes", "quarantined", "staging dirs", title="cache size")
    usage = Table(
        "tenant",
        "processes",
        "requests",
        "memory hit",
        "disk hit",
        "compiles",
        "errors",
        "compile p50",
        "p90",
        "p99",
        title="usage (from closed runtimes)",
    )
    for root in _roots(args):
        groups: dict[tuple[str, str], list[int]] = {}
        for info in maintenance.iter_leaves(root):
            g = groups.setdefault((info.tenant, info.backend), [0, 0])
            g[0] += 1
            g[1] += info.size
        quarantined = _count_dir(os.path.join(root, LAYOUT, "quarantine"))
        staging = _count_dir(os.path.join(root, LAYOUT, "tmp"))
        for (tenant, backend), (n, total) in sorted(groups.items()) or [(("-", "-"), [0, 0])]:
            size.add_row(root, tenant, backend, str(n), f"{total:,}", str(quarantined), str(staging))
        for tenant, row in _usage_rows(root):
            usage.add_row(tenant, *row)
    console.print(size)
    console.print(usage)
    return 0


def _usage_rows(root: str) -> list[tuple[str, list[str]]]:
    per: dict[str, dict[str, Any]] = {}
    for tenant, record in read_usage(root):
        agg = per.setdefault(tenant, {"processes": 0, "samples": [], **dict.fromkeys(_USAGE_KEYS, 0)})
        agg["processes"] += 1
        for key in _USAGE_KEYS:
            value = record["counters"].get(key, 0)
            agg[key] += value if isinstance(value, int) else 0
        agg["samples"] += [s for s in record.get("compile_seconds", []) if isinstance(s, (int, float))]
    rows = []
    for tenant, agg in sorted(per.items()):
        requests = agg["memory_hits"] + agg["disk_hits"] + agg["misses"]
        below_memory = agg["disk_hits"] + agg["misses"]
        samples = sorted(agg["samples"])
        rows.append(
            (
                tenant,
                [
                    str(agg["processes"]),
                    f"{requests:,}",
                    _rate(agg["memory_hits"], requests),
                    _rate(agg["disk_hits"], below_memory),
                    f"{agg['compiles']:,}",
                    f"{agg['errors']:,}",
                    *(_percentile(samples, q) for q in (0.5, 0.9, 0.99)),
                ],
            )
        )
    return rows


_USAGE_KEYS = ("memory_hits", "disk_hits", "misses", "compiles", "errors")


def _rate(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _percentile(samples: list[float], q: float) -> str:
    if not samples:
        return "-"
    value = samples[min(len(samples) - 1, int(q * len(samples)))]
    return f"{value * 1e3:.1f} ms"


def _cmd_verify(args: argparse.Namespace) -> int:
    failed = total = 0
    for root in _roots(args):
        for info, bad in maintenance.verify_all(root, fix=args.fix):
            total += 1
            if bad is not None:
                failed += 1
                action = " (quarantined)" if args.fix else ""
                console.print(f"[red]FAIL[/] {info.path}: {bad.reason}: {bad.detail}{action}")
    console.print(f"{total - failed}/{total} leaves verify")
    return 1 if failed else 0


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1024`` (bytes)."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS and not t[-1:].isdigit() else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * _SIZE_UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600`` (seconds)."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _AGE_UNITS else "s"
    try:
        return float(t[: len(t) - (len(t) > 0 and t[-1:] in _AGE_UNITS)]) * _AGE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an age: {text!r}") from None


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _cmd_prune(args: argparse.Namespace) -> int:
    if args.max_bytes is None and args.max_age is None and args.keep_per_build is None:
        console.print("[red]error[/]: give at least one of --max-bytes, --max-age, --keep-per-build")
        return 2
    table = Table("root", "leaves", "removed", "freed bytes", "spared (touched within grace)")
    for root in _roots(args):
        total = sum(1 for _ in maintenance.iter_leaves(root))
        with _progress() as bar:
            task = bar.add_task(f"pruning {root}", total=total)

            def advance(n: int, bar: Progress = bar, task: TaskID = task) -> None:
                bar.update(task, completed=n)

            report = maintenance.prune(
                root,
                max_bytes=args.max_bytes,
                max_age_s=args.max_age,
                keep_per_build=args.keep_per_build,
                grace_s=args.grace,
                progress=advance,
            )
        table.add_row(root, str(report.examined), str(report.removed), f"{report.freed:,}", str(report.kept_recent))
    console.print(table)
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    table = Table("root", "staging", "quarantine", "usage", "locks")
    for root in _roots(args):
        counts = maintenance.gc(root, max_age_s=args.older_than)
        table.add_row(root, *(str(counts[k]) for k in ("staging", "quarantine", "usage", "locks")))
    console.print(table)
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    cfg = _config(args.cache_dir)
    if args.source_root:
        cfg = cfg.replace(source_roots=tuple(args.source_root))
    rt = Runtime(config=cfg)
    defines = dict(d.split("=", 1) if "=" in d else (d, None) for d in args.define)
    extras = dict(e.split("=", 1) for e in args.extra)
    explanation = rt.explain(
        rt.source(args.source), include_dirs=tuple(args.include), defines=defines, flags=tuple(args.flag), extras=extras
    )
    colour = "green" if explanation.result == "hit" else "yellow"
    console.print(f"[{colour}]{explanation.result}[/]: {explanation.reason}")
    if explanation.path:
        console.print(f"  file:      {explanation.path}")
    if explanation.leaf:
        console.print(f"  leaf:      {explanation.leaf}")
    console.print(f"  build key: {explanation.build_key}")
    rt.close()
    return 0 if explanation.result == "hit" else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .cache.manifest import ManifestError, parse_manifest

    leaf = os.path.realpath(args.leaf)
    try:
        with open(os.path.join(leaf, "manifest.json"), "rb") as fh:
            man = parse_manifest(fh.read())
    except (OSError, ManifestError) as exc:
        console.print(f"[red]error[/]: {leaf}: {exc}")
        return 1
    table = Table(show_header=False, title=leaf)
    for label, value in (
        ("name", man.name),
        ("tenant", man.tenant),
        ("backend", man.backend),
        ("build key", man.build_key),
        ("deps key", man.deps_key),
        ("artifact", f"{man.artifact_file} ({man.artifact_size:,} bytes, {man.artifact_digest[:16]})"),
        ("kernels", ", ".join(man.kernels)),
        ("compiler", str(man.toolchain.get("compiler"))),
        ("version", (str(man.toolchain.get("version", "")).splitlines() or [""])[0]),
        ("timings", json.dumps(man.timings)),
        ("created", time.ctime(man.created)),
        ("signed", "yes" if man.signature else "no"),
        ("argv", " ".join(a.replace("\0", "@") for a in man.argv)),
    ):
        table.add_row(label, str(value))
    console.print(table)
    deps = Table("anchor", "path", "digest", title=f"{len(man.deps)} dependencies, {len(man.negatives)} negative")
    for anchor, rel, digest in man.deps:
        deps.add_row(anchor, rel, digest[:16])
    for anchor, rel in man.negatives:
        deps.add_row(anchor, rel, "[dim]must not exist[/]")
    console.print(deps)
    extra = sorted(set(os.listdir(leaf)) - {"manifest.json", ".committed", man.artifact_file})
    if extra:
        console.print(f"dumps: {', '.join(extra)}")
    return 0


def _warm_one(cache_dir: str | None, source_roots: tuple[str, ...], data: dict[str, Any]) -> str:
    from .inventory import Request

    cfg = _config(cache_dir)
    if source_roots:
        cfg = cfg.replace(source_roots=source_roots)
    cfg = cfg.replace(tenant=data.get("tenant", cfg.tenant), backend=data.get("backend", cfg.backend))
    with Runtime(config=cfg) as rt:
        try:
            return rt.warm(Request(data))
        except SafejitError as exc:
            return f"failed: {type(exc).__name__}: {exc}"[:300]


def _cmd_warm(args: argparse.Namespace) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .inventory import read_inventory

    requests = list(read_inventory(args.inventory))
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool, _progress() as bar:
        task = bar.add_task("warming", total=len(requests))
        futures = [pool.submit(_warm_one, args.cache_dir, tuple(args.source_root), r.data) for r in requests]
        for future in as_completed(futures):
            result = future.result()
            key = result.split(":", 1)[0]
            outcomes[key] = outcomes.get(key, 0) + 1
            if key == "failed":
                failures.append(result)
            bar.advance(task)
    for line in failures:
        console.print(f"[red]{line}[/]")
    console.print(f"{len(requests)} requests: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    return 1 if failures else 0


def _count_dir(path: str) -> int:
    try:
        with os.scandir(path) as it:
            return sum(1 for _ in it)
    except OSError:
        return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="safejit", description="Run-time kernel compilation with a verified cache.")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile a kernel on the host backend and show each cache tier")
    demo.add_argument("--trace", action="store_true", help="print the span tree (needs safejit[otel])")
    demo.add_argument("--keep", action="store_true", help="keep the demo's cache entry")
    child = sub.add_parser("_demo-child")
    child.add_argument("nonce")
    for cmd in (demo, child):
        cmd.add_argument("--cache-dir")
    prune = sub.add_parser("prune", help="delete leaves by age, count per build and total size (LRU)")
    prune.add_argument("--max-bytes", type=parse_size, help="e.g. 10G")
    prune.add_argument("--max-age", type=parse_age, help="e.g. 30d")
    prune.add_argument("--keep-per-build", type=int, help="newest leaves kept per build key")
    prune.add_argument("--grace", type=parse_age, default=60.0, help="never delete a leaf touched this recently")
    gc = sub.add_parser("gc", help="remove staging residue, quarantine, old usage records and idle locks")
    gc.add_argument("--older-than", type=parse_age, default=86400.0)
    explain = sub.add_parser("explain", help="why would this source hit or miss? (exit 0 on a hit)")
    explain.add_argument("source")
    explain.add_argument("-I", "--include", action="append", default=[])
    explain.add_argument("-D", "--define", action="append", default=[])
    explain.add_argument("--flag", action="append", default=[])
    explain.add_argument("--extra", action="append", default=[], help="NAME=JSON")
    explain.add_argument("--source-root", action="append", default=[])
    inspect = sub.add_parser("inspect", help="show a leaf: manifest, argv, timings, dependencies")
    inspect.add_argument("leaf")
    warm = sub.add_parser("warm", help="rebuild an inventory's requests in parallel, skipping what verifies")
    warm.add_argument("inventory")
    warm.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    warm.add_argument("--source-root", action="append", default=[])
    for cmd in (prune, gc, explain, warm):
        cmd.add_argument("--cache-dir")
    for name, text in (
        ("ls", "list cache leaves"),
        ("stats", "cache size by tenant and backend"),
        ("verify", "rehash every leaf; exit 0 only when all verify"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--cache-dir")
        if name == "verify":
            cmd.add_argument("--fix", action="store_true", help="quarantine leaves that fail")
    return p


_COMMANDS = {
    "prune": _cmd_prune,
    "gc": _cmd_gc,
    "explain": _cmd_explain,
    "inspect": _cmd_inspect,
    "warm": _cmd_warm,
    "demo": _cmd_demo,
    "_demo-child": _cmd_demo_child,
    "ls": _cmd_ls,
    "stats": _cmd_stats,
    "verify": _cmd_verify,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except SafejitError as exc:
        console.print(f"[red]error[/]: {type(exc).__name__}: {exc}")
        return 2
