"""``safejit warm``: replay an inventory in parallel processes."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import SafejitError
from ..runtime import Runtime
from ._common import config_for, console, progress


def _warm_one(cache_dir: str | None, source_roots: tuple[str, ...], data: dict[str, Any]) -> str:
    from ..inventory import Request

    cfg = config_for(cache_dir)
    if source_roots:
        cfg = cfg.replace(source_roots=source_roots)
    cfg = cfg.replace(tenant=data.get("tenant", cfg.tenant), backend=data.get("backend", cfg.backend))
    with Runtime(config=cfg) as rt:
        try:
            return rt.warm(Request(data))
        except SafejitError as exc:
            return f"failed: {type(exc).__name__}: {exc}"[:300]


def cmd_warm(args: argparse.Namespace) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from ..inventory import read_inventory

    requests = list(read_inventory(args.inventory))
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool, progress() as bar:
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
