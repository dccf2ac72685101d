"""``safejit ls`` and ``safejit stats``: what a cache holds, and how it was used."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..cache import maintenance
from ..cache.layout import LeafPath
from ..cache.leaf import ManifestError
from ._common import (
    EXIT_FINDINGS,
    EXIT_OK,
    Finding,
    ago,
    cache_roots,
    layout_findings,
    show_findings,
    size_text,
)
from ._out import Out

__all__ = ["cmd_ls", "cmd_stats"]


@dataclass(frozen=True, slots=True)
class Listed:
    info: maintenance.LeafInfo
    kernel: str | None


def _listed(root: str, args: argparse.Namespace, findings: list[Finding]) -> list[Listed]:
    found = []
    unreadable: list[LeafPath] = []
    for info in maintenance.iter_leaves(root, unreadable=unreadable):
        if (args.tenant and info.tenant != args.tenant) or (args.backend and info.backend != args.backend):
            continue
        try:
            kernel: str | None = maintenance.read_manifest(info).name
        except (OSError, ManifestError) as exc:
            kernel = None
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            findings.append(Finding("leaf", info.path, "manifest", f"the manifest cannot be read: {detail}", info.id))
        found.append(Listed(info, kernel))
    findings += (Finding("leaf", f.path, "io", "this user cannot read the leaf", "") for f in unreadable)
    found.sort(key=lambda x: (x.info.tenant, x.info.backend, x.kernel or "", -x.info.mtime))
    return found


def cmd_ls(args: argparse.Namespace, out: Out) -> int:
    roots = cache_roots(args.cache_dir)
    findings: list[Finding] = []
    per_root = []
    for root in roots.dirs:
        findings += layout_findings(root)
        per_root.append((root, _listed(root, args, findings)))
    if args.json:
        out.json(
            {
                "roots": list(roots.dirs),
                "leaves": [_leaf_json(x) for _, listed in per_root for x in listed],
                "findings": [f.as_json() for f in findings],
            }
        )
        return EXIT_FINDINGS if findings else EXIT_OK
    if roots.missing_default:
        out.line(f"no cache at {roots.missing_default} yet")
    for root, listed in per_root:
        if args.paths:
            for x in listed:
                out.line(x.info.id, "  ", x.info.path)
            continue
        total = sum(x.info.size for x in listed)
        if listed:
            rows = [
                (x.info.id, x.kernel or "?", x.info.tenant, x.info.backend, size_text(x.info.size), ago(x.info.mtime))
                for x in listed
            ]
            out.table(("ID", "KERNEL", "TENANT", "BACKEND", "SIZE", "AGE"), rows, right={4, 5}, shrink={1, 2, 3})
        out.line(f"{len(listed)} leaves, {size_text(total)} in {root}")
    if any(listed for _, listed in per_root) and not args.paths:
        out.line(("safejit inspect ID shows a leaf; safejit ls --paths lists their directories", "dim"))
    show_findings(out, findings)
    return EXIT_FINDINGS if findings else EXIT_OK


def _leaf_json(x: Listed) -> dict[str, object]:
    i = x.info
    return {
        "id": i.id,
        "root": i.root,
        "tenant": i.tenant,
        "backend": i.backend,
        "kernel": x.kernel,
        "build_key": i.build_key,
        "deps_key": i.deps_key,
        "path": i.path,
        "bytes": i.size,
        "mtime": i.mtime,
    }


# -- stats ------------------------------------------------------------------------
_COUNTERS = ("memory_hits", "disk_hits", "misses", "compiles", "errors")


@dataclass
class _Usage:
    processes: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTERS, 0))
    samples: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return self.counts["memory_hits"] + self.counts["disk_hits"] + self.counts["misses"]

    def rates(self) -> tuple[float | None, float | None]:
        below_memory = self.counts["disk_hits"] + self.counts["misses"]
        memory = self.counts["memory_hits"] / self.requests if self.requests else None
        return memory, (self.counts["disk_hits"] / below_memory if below_memory else None)

    def percentile(self, q: float) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _usage_of(root: str, findings: list[Finding]) -> dict[str, _Usage]:
    per: dict[str, _Usage] = {}
    for entry in maintenance.read_usage(root):
        if entry.record is None:
            findings.append(Finding("usage", entry.path, "usage", entry.problem))
            continue
        agg = per.setdefault(entry.tenant, _Usage())
        agg.processes += 1
        for key in _COUNTERS:
            agg.counts[key] += entry.record.counters.get(key, 0)
        agg.samples += entry.record.compile_seconds
    return per


def _sizes(root: str) -> dict[tuple[str, str], list[int]]:
    groups: dict[tuple[str, str], list[int]] = {}
    for info in maintenance.iter_leaves(root):
        g = groups.setdefault((info.tenant, info.backend), [0, 0])
        g[0] += 1
        g[1] += info.size
    return dict(sorted(groups.items()))


def cmd_stats(args: argparse.Namespace, out: Out) -> int:
    roots = cache_roots(args.cache_dir)
    findings: list[Finding] = []
    report = []
    for root in roots.dirs:
        findings += layout_findings(root)
        usage = _usage_of(root, findings)
        extra = {name: maintenance.count_entries(root, name) for name in ("quarantine", "tmp")}
        report.append((root, _sizes(root), extra, usage))
    if args.json:
        out.json({"roots": [_stats_json(*r) for r in report], "findings": [f.as_json() for f in findings]})
        return EXIT_FINDINGS if findings else EXIT_OK
    if roots.missing_default:
        out.line(f"no cache at {roots.missing_default} yet")
    for root, sizes, extra, usage in report:
        out.line(("cache root ", "bold"), (root, "bold"))
        rows = [(t, b, str(n), size_text(total)) for (t, b), (n, total) in sizes.items()]
        out.table(
            ("TENANT", "BACKEND", "LEAVES", "SIZE"), rows or [("-", "-", "0", "0 B")], right={2, 3}, shrink={0, 1}
        )
        shown = {k: "not a directory" if v is None else str(v) for k, v in extra.items()}
        out.line(f"quarantined entries: {shown['quarantine']}; staging dirs: {shown['tmp']}")
        _usage_tables(out, usage)
    show_findings(out, findings)
    return EXIT_FINDINGS if findings else EXIT_OK


def _usage_tables(out: Out, usage: dict[str, _Usage]) -> None:
    if not usage:
        out.line(("no usage records yet (a Runtime writes one when it closes)", "dim"))
        return
    rows = []
    for tenant, u in sorted(usage.items()):
        memory, disk = u.rates()
        c = u.counts
        rows.append(
            (
                tenant,
                str(u.processes),
                f"{u.requests:,}",
                _pct(memory),
                _pct(disk),
                f"{c['compiles']:,}",
                f"{c['errors']:,}",
            )
        )
    out.table(
        ("TENANT", "PROCESSES", "REQUESTS", "MEMORY HIT", "DISK HIT", "COMPILES", "ERRORS"),
        rows,
        title="usage (from closed runtimes)",
        right=range(1, 7),
        shrink={0},
    )
    out.line(("memory hit: requests served from memory; disk hit: of the rest, found on disk", "dim"))
    latency = [
        (tenant, str(len(u.samples)), *(_ms(u.percentile(q)) for q in (0.5, 0.9, 0.99, 1.0)))
        for tenant, u in sorted(usage.items())
    ]
    out.table(("TENANT", "SAMPLES", "P50", "P90", "P99", "MAX"), latency, title="compile time", right=range(1, 6))


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100.0 * rate:.1f}%"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _stats_json(
    root: str, sizes: dict[tuple[str, str], list[int]], extra: dict[str, int | None], usage: dict[str, _Usage]
) -> dict[str, object]:
    def usage_json(tenant: str, u: _Usage) -> dict[str, object]:
        memory, disk = u.rates()
        latency = {f"p{int(q * 100)}": u.percentile(q) for q in (0.5, 0.9, 0.99)}
        latency["max"] = u.percentile(1.0)
        return {
            "tenant": tenant,
            "processes": u.processes,
            "requests": u.requests,
            **u.counts,
            "memory_hit_rate": memory,
            "disk_hit_rate": disk,
            "compile_seconds": latency,
        }

    return {
        "root": root,
        "leaves": [{"tenant": t, "backend": b, "leaves": n, "bytes": total} for (t, b), (n, total) in sizes.items()],
        "quarantined": extra["quarantine"],
        "staging": extra["tmp"],
        "usage": [usage_json(t, u) for t, u in sorted(usage.items())],
    }
