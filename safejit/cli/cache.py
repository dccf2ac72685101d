"""Cache commands: ls, stats, verify, prune, gc, explain, inspect."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from rich.progress import Progress, TaskID
from rich.table import Table

from ..cache import maintenance
from ..cache.fsio import read_bytes
from ..cache.layout import MANIFEST, MARKER, CacheLayout
from ..cache.usage import read_usage
from ..runtime import Runtime
from ._common import age_text, config_for, console, count_dir, progress, roots_of


def cmd_ls(args: argparse.Namespace) -> int:
    table = Table("tenant", "backend", "build key", "deps key", "bytes", "age", title="safejit cache")
    count = 0
    for root in roots_of(args):
        for info in maintenance.iter_leaves(root):
            count += 1
            table.add_row(
                info.tenant,
                info.backend,
                info.build_key[:16],
                info.deps_key[:16],
                f"{info.size:,}",
                age_text(time.time() - info.mtime),
            )
    console.print(table)
    console.print(f"{count} leaves")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
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
    for root in roots_of(args):
        groups: dict[tuple[str, str], list[int]] = {}
        for info in maintenance.iter_leaves(root):
            g = groups.setdefault((info.tenant, info.backend), [0, 0])
            g[0] += 1
            g[1] += info.size
        quarantined = count_dir(CacheLayout(root).quarantine)
        staging = count_dir(CacheLayout(root).tmp)
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


def cmd_verify(args: argparse.Namespace) -> int:
    failed = total = 0
    for root in roots_of(args):
        count = sum(1 for _ in maintenance.iter_leaves(root))
        with progress() as bar:
            task = bar.add_task(f"verifying {root}", total=count)
            for info, bad in maintenance.verify_all(root, fix=args.fix):
                total += 1
                bar.advance(task)
                if bad is not None:
                    failed += 1
                    action = " (quarantined)" if args.fix else ""
                    bar.console.print(f"[red]FAIL[/] {info.path}: {bad.reason}: {bad.detail}{action}")
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


def cmd_prune(args: argparse.Namespace) -> int:
    if args.max_bytes is None and args.max_age is None and args.keep_per_build is None:
        console.print("[red]error[/]: give at least one of --max-bytes, --max-age, --keep-per-build")
        return 2
    table = Table("root", "leaves", "removed", "freed bytes", "spared (touched within grace)")
    for root in roots_of(args):
        total = sum(1 for _ in maintenance.iter_leaves(root))
        with progress() as bar:
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


def cmd_gc(args: argparse.Namespace) -> int:
    table = Table("root", "staging", "quarantine", "usage")
    for root in roots_of(args):
        counts = maintenance.gc(root, max_age_s=args.older_than)
        table.add_row(root, *(str(counts[k]) for k in ("staging", "quarantine", "usage")))
    console.print(table)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    cfg = config_for(args.cache_dir)
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


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..cache.leaf import ManifestError, decode_manifest

    leaf = os.path.realpath(args.leaf)
    try:
        man = decode_manifest(read_bytes(os.path.join(leaf, MANIFEST), 1 << 24))
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
    extra = sorted(set(os.listdir(leaf)) - {MANIFEST, MARKER, man.artifact_file})
    if extra:
        console.print(f"dumps: {', '.join(extra)}")
    return 0
