"""``safejit warm``: replay an inventory in parallel processes."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import SafejitError
from ..runtime import Runtime
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, config_for
from ._out import Out

__all__ = ["cmd_warm"]

#: Why ``Runtime.warm`` skips a request.
SKIPPED_WHY = "a root it names is not declared here (--source-root, or SAFEJIT_SOURCE_ROOTS)"


def _warm_one(cache_dir: str | None, source_roots: tuple[str, ...], data: dict[str, Any]) -> str:
    from ..inventory import Request

    try:
        cfg = config_for(cache_dir, source_roots=source_roots)
        cfg = cfg.replace(tenant=data.get("tenant", cfg.tenant), backend=data.get("backend", cfg.backend))
        with Runtime(config=cfg) as rt:
            return rt.warm(Request(data))
    except SafejitError as exc:
        return f"failed: {data.get('name', '?')}: {type(exc).__name__}: {exc}"[:300]
    except (KeyError, TypeError, ValueError) as exc:  # (an inventory line of the right version, wrong shape)
        return f"failed: {data.get('name', '?')}: a malformed inventory request ({type(exc).__name__}: {exc})"[:300]


def cmd_warm(args: argparse.Namespace, out: Out) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from ..inventory import read_inventory

    try:
        requests = list(read_inventory(args.inventory))
    except UnicodeDecodeError as exc:
        raise CliError(f"{args.inventory}: not a JSON-lines inventory ({exc.reason})") from None
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool,
        out.progress("warming", len(requests)) as done,
    ):
        futures = [pool.submit(_warm_one, args.cache_dir, tuple(args.source_root), r.data) for r in requests]
        for n, future in enumerate(as_completed(futures), 1):
            result = future.result()
            key = result.split(":", 1)[0]
            outcomes[key] = outcomes.get(key, 0) + 1
            if key == "failed":
                failures.append(result)
            done(n)
    for line in failures:
        out.line((line, "bad"))
    out.line(f"{len(requests)} requests: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if outcomes.get("skipped"):
        out.line((f"skipped {outcomes['skipped']}: {SKIPPED_WHY}", "warn"))
    return EXIT_FINDINGS if failures or outcomes.get("skipped") else EXIT_OK
