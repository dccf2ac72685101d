"""The ``safejit`` command: demo, ls, stats, verify, prune, gc, explain, inspect, warm."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from ..errors import SafejitError
from . import cache, demo, warm
from ._common import console
from .cache import parse_age, parse_size

__all__ = ["main", "parse_age", "parse_size"]


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
    "prune": cache.cmd_prune,
    "gc": cache.cmd_gc,
    "explain": cache.cmd_explain,
    "inspect": cache.cmd_inspect,
    "warm": warm.cmd_warm,
    "demo": demo.cmd_demo,
    "_demo-child": demo.cmd_demo_child,
    "ls": cache.cmd_ls,
    "stats": cache.cmd_stats,
    "verify": cache.cmd_verify,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except SafejitError as exc:
        console.print(f"[red]error[/]: {type(exc).__name__}: {exc}")
        return 2
