"""``safejit verify``, ``safejit prune`` and ``safejit gc``: keeping a cache sound and small."""

from __future__ import annotations

import argparse

from ..cache import maintenance
from ..errors import ConfigError
from ..policy.trust import config_policy
from ..sandbox.statedir import state_dir
from ._common import (
    EXIT_FINDINGS,
    EXIT_OK,
    CliError,
    Finding,
    cache_roots,
    config_for,
    layout_findings,
    show_findings,
    size_text,
)
from ._out import Out

__all__ = ["cmd_gc", "cmd_prune", "cmd_verify"]


def cmd_verify(args: argparse.Namespace, out: Out) -> int:
    roots = cache_roots(args.cache_dir)
    # (the tenant's signatures checked as its processes check them: SAFEJIT_VERIFY_KEYS, ...)
    try:
        cfg = config_for(args.cache_dir, tenant=args.tenant)
        verifier, tenant = config_policy(cfg), cfg.tenant
    except ConfigError as exc:  # (the leaves are checked all the same)
        out.warn(f"signatures not checked: {exc}")
        verifier, tenant = None, None
    findings: list[Finding] = []
    checked = 0
    for root in roots.dirs:
        count = sum(1 for _ in maintenance.iter_leaves(root))
        with out.progress(f"verifying {root}", count) as done:
            moved: set[str] = set()
            for info, bad in maintenance.verify_all(root, fix=args.fix, moved=moved, verifier=verifier, tenant=tenant):
                checked += 1
                done(checked)
                if bad is not None:
                    fixed = "quarantined" if info.path in moved else ""
                    what = "layout" if not info.build_key else "leaf"
                    detail = f"{bad.reason.text}: {bad.detail}" if bad.detail else bad.reason.text
                    findings.append(
                        Finding(what, info.path, bad.reason.value, detail, info.id if info.build_key else "", fixed)
                    )
        findings += _usage_findings(root, fix=args.fix)
    failed = sum(1 for f in findings if f.kind != "usage")
    if args.json:
        out.json(
            {
                "roots": list(roots.dirs),
                "checked": checked,
                "verified": checked - failed,
                "findings": [f.as_json() for f in findings],
            }
        )
        return EXIT_FINDINGS if findings else EXIT_OK
    if roots.missing_default:
        out.line(f"no cache at {roots.missing_default} yet")
    show_findings(out, findings)
    out.line((f"{checked - failed}/{checked} leaves verify", "ok" if not failed else "bad"))
    if verifier is not None:
        out.line((f"signatures checked: tenant {tenant!r}'s leaves (--tenant)", "dim"))
    usage = len(findings) - failed
    if usage:
        out.line((f"{usage} usage records are not valid", "bad"))
    return EXIT_FINDINGS if findings else EXIT_OK


def _usage_findings(root: str, *, fix: bool) -> list[Finding]:
    """Usage records that do not decode (with ``fix``, deleted: they are only counters)."""
    found = []
    for entry in maintenance.read_usage(root):
        if entry.record is not None:
            continue
        removed = ""
        if fix and not entry.foreign and maintenance.remove_usage(root, entry):  # (another's: left be)
            removed = "removed"
        found.append(Finding("usage", entry.path, "usage", entry.problem, fixed=removed))
    return found


def cmd_prune(args: argparse.Namespace, out: Out) -> int:
    max_bytes = args.max_bytes
    if max_bytes is None and args.max_age is None and args.keep_per_build is None:
        max_bytes = config_for(None).cache_max_bytes
        if max_bytes is None:
            raise CliError(
                "give at least one of --max-bytes, --max-age, --keep-per-build",
                "(or set a default cap: SAFEJIT_CACHE_MAX_BYTES=10G)",
            )
    roots = cache_roots(args.cache_dir)
    results = []
    for root in roots.dirs:
        total = sum(1 for _ in maintenance.iter_leaves(root))
        with out.progress(f"pruning {root}", total) as done:
            report = maintenance.prune(
                root,
                max_bytes=max_bytes,
                max_age_s=args.max_age,
                keep_per_build=args.keep_per_build,
                grace_s=args.grace,
                progress=done,
                dry_run=args.dry_run,
            )
        results.append((root, report))
    if args.json:
        out.json(
            {
                "dry_run": args.dry_run,
                "roots": [
                    {
                        "root": r,
                        "leaves": p.examined,
                        "removed": p.removed,
                        "freed_bytes": p.freed,
                        "spared": p.kept_recent,
                        "failed": p.failed,
                    }
                    for r, p in results
                ],
            }
        )
        return EXIT_FINDINGS if any(p.failed for _, p in results) else EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for root, p in results:
        out.line(("cache root ", "bold"), (root, "bold"))
        out.line(
            f"  {p.examined} leaves; {verb} {p.removed} ({size_text(p.freed)}); "
            f"spared {p.kept_recent} used within the last {args.grace:.6g}s"
        )
        if p.failed:
            out.line((f"  could not remove {p.failed} (not this user's to remove?)", "warn"))
    if args.dry_run:
        out.line(("dry run: nothing was deleted", "warn"))
    return EXIT_FINDINGS if any(p.failed for _, p in results) else EXIT_OK


def cmd_gc(args: argparse.Namespace, out: Out) -> int:
    roots = cache_roots(args.cache_dir)
    # (the marks of this user's processes, which say whose work dirs are in use)
    marks = {root: state_dir(avoid=(root,)).path for root in roots.dirs}
    results = [(root, maintenance.gc(root, max_age_s=args.older_than, marks=marks[root])) for root in roots.dirs]
    # What gc could not set aside (a v1 that is a symlink: nothing is done there at all).
    left = [f for root in roots.dirs for f in layout_findings(root)]
    if args.json:
        out.json({"roots": [{"root": r, **counts} for r, counts in results], "findings": [f.as_json() for f in left]})
        return EXIT_FINDINGS if left else EXIT_OK
    keys = ("staging", "quarantine", "usage", "locks", "empty", "damaged", "obsolete")
    for root, counts in results:
        out.line(("cache root ", "bold"), (root, "bold"))
        out.table(
            ("STAGING", "QUARANTINE", "USAGE", "LOCKS", "EMPTY", "DAMAGED", "OBSOLETE"),
            [tuple(str(counts[k]) for k in keys)],
            right=range(7),
        )
    out.line(("removed: what is older than the age given, and v1/tools; damaged: quarantined", "dim"))
    out.line(("empty: build dirs no leaf went into (a failed or killed compile's)", "dim"))
    show_findings(out, left)
    return EXIT_FINDINGS if left else EXIT_OK
