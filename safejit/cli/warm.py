"""``safejit warm``: replay an inventory in parallel processes; with ``--remote``, fill a
remote cache too (a build service filling its fleet's cache): each request runs in a
Runtime whose remote tier is on and writable, its build or disk hit is uploaded unless
the remote has it, and the process waits for the upload before it reports."""

from __future__ import annotations

import argparse
from typing import Any, Final

from ..errors import ConfigError, SafejitError
from ..outcomes import Outcome
from ..runtime import Runtime
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, config_for
from ._out import Out
from ._remote import round_trip, store_of, warn_password_in_argv

__all__ = ["cmd_warm"]

#: Why ``Runtime.warm`` skips a request.
SKIPPED_WHY = "a root it names is not declared here (--source-root, or SAFEJIT_SOURCE_ROOTS)"
#: How long a request's process waits for its upload (each remote operation is bounded
#: by its own deadline, and the breaker stops a failing remote being asked: a backstop).
UPLOAD_WAIT_S: Final = 120.0
#: The largest key file ``--signing-key`` reads.
KEY_FILE_LIMIT: Final = 64 << 10
#: ``Runtime.warm``'s answers as ``--remote`` shows them.
SHOWN: Final = {"hit": "disk hit", "remote": "remote hit", "built": "compiled"}
#: What became of a request's upload (``upload`` in ``--json``), as a cell of the table.
UPLOAD_SHOWN: Final = {
    "uploaded": "uploaded",
    "present": "already there",
    "index_full": "skipped: index full",
    "unsigned": "skipped: not signed",
    "failed": "failed",
    "dropped": "dropped: queue full",
    "unfinished": "not finished",
}
#: The upload outcomes that fail the command.
UPLOAD_FAILURES: Final = frozenset({"failed", "dropped", "unfinished"})


def _warm_one(
    cache_dir: str | None,
    source_roots: tuple[str, ...],
    data: dict[str, Any],
    remote: str | None,
    signing_key: bytes | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """One request in this (spawned) process: ``{name, tenant, result, detail, upload,
    upload_reason, upload_detail}`` (``result``: hit, remote, built, skipped, failed).
    The library's log lines go to this process's stderr, as the command's own do."""
    import sys

    from . import _logging

    with _logging(verbose, sys.stderr):
        return _warm_request(cache_dir, source_roots, data, remote, signing_key)


def _warm_request(
    cache_dir: str | None,
    source_roots: tuple[str, ...],
    data: dict[str, Any],
    remote: str | None,
    signing_key: bytes | None,
) -> dict[str, Any]:
    from ..inventory import Request

    name = str(data.get("name", "?"))
    done: dict[str, Any] = {"name": name, "tenant": str(data.get("tenant", "")), "result": "failed", "detail": ""}
    done.update(upload=None, upload_reason="", upload_detail="")
    try:
        cfg = config_for(cache_dir, source_roots=source_roots, signing_key=signing_key)
        cfg = cfg.replace(tenant=data.get("tenant", cfg.tenant), backend=data.get("backend", cfg.backend))
        if remote is not None:
            cfg = cfg.replace(remote=remote or cfg.remote, remote_mode="read-write")
        done["tenant"] = cfg.tenant
        with Runtime(config=cfg) as rt:
            request = Request(data)
            done["result"] = rt.warm(request, fill_remote=remote is not None)
            if done["result"] == "skipped":
                declared = ", ".join(f"s{i}={root}" for i, root in enumerate(cfg.source_roots)) or "none"
                done["detail"] = f"it names {', '.join(request.roots_named())}; declared here: {declared}"
            if remote is not None:
                done.update(_upload_of(rt))
    except SafejitError as exc:
        done["detail"] = f"{type(exc).__name__}: {exc}"[:300]
    except (KeyError, TypeError, ValueError) as exc:  # (an inventory line of the right version, wrong shape)
        done["detail"] = f"a malformed inventory request ({type(exc).__name__}: {exc})"[:300]
    return done


def _upload_of(rt: Runtime) -> dict[str, Any]:
    """``{upload, upload_reason, upload_detail}`` of the request's leaf, once the upload
    queue has drained (``upload`` None: nothing was offered, as for a remote hit)."""
    from ..cache.remote.uploads import INDEX_FULL, PRESENT, UNSIGNED

    uploads = rt.flush_uploads(UPLOAD_WAIT_S)
    if not uploads.results:
        unfinished = not uploads.done
        detail = f"still queued after {UPLOAD_WAIT_S:.0f} s" if unfinished else ""
        return {"upload": "unfinished" if unfinished else None, "upload_reason": "", "upload_detail": detail}
    last = uploads.results[-1]  # (one request, one leaf)
    upload = {
        Outcome.UPLOADED: "present" if last.detail == PRESENT else "uploaded",
        Outcome.UPLOAD_SKIPPED: {PRESENT: "present", INDEX_FULL: "index_full", UNSIGNED: "unsigned"}.get(last.detail),
        Outcome.UPLOAD_FAILED: "failed",
        Outcome.UPLOAD_DROPPED: "dropped",
    }[last.outcome]
    return {"upload": upload, "upload_reason": last.reason, "upload_detail": last.detail[:300]}


def _remote_of(args: argparse.Namespace) -> str | None:
    """``--remote``'s URL ("" for the configured one), None without it. The remote must
    answer now: a build service that cannot fill it stops here (exit 2), before compiling."""
    if args.remote is None:
        return None
    url: str = args.remote
    cfg = config_for(args.cache_dir)
    if not url and not cfg.remote:
        raise CliError("--remote needs a URL, or SAFEJIT_REMOTE set")
    store = store_of(cfg.replace(remote=url or cfg.remote, remote_mode="read-write"))
    try:
        round_trip(store, writes=True)
    finally:
        store.close()
    return url


def _signing_key(path: str | None) -> bytes | None:
    """The key in ``--signing-key FILE`` (checked now: a bad key stops the command)."""
    if path is None:
        return None
    from ..policy.trust import signer_of

    try:
        with open(path, "rb") as f:
            key = f.read(KEY_FILE_LIMIT + 1)
    except OSError as exc:
        raise CliError(f"--signing-key {path}: {exc.strerror or exc}") from None
    if len(key) > KEY_FILE_LIMIT:
        raise CliError(f"--signing-key {path}: larger than {KEY_FILE_LIMIT} bytes: not a key")
    try:
        signer_of(key)  # (the file's bytes are the key: PEM, or an HMAC key of 16 bytes or more)
    except ConfigError as exc:
        raise CliError(f"--signing-key {path}: {exc}") from None
    return key


def cmd_warm(args: argparse.Namespace, out: Out) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from ..inventory import read_inventory

    warn_password_in_argv(args.remote, out)
    signing_key = _signing_key(args.signing_key)
    if args.remote is not None and signing_key is None:  # (before the remote is asked anything)
        raise CliError("--remote needs --signing-key FILE: a node uses a remote leaf only when it is signed")
    remote = _remote_of(args)
    skipped: list[int] = []
    try:
        requests = list(read_inventory(args.inventory, skipped))
    except UnicodeDecodeError as exc:
        raise CliError(f"{args.inventory}: not a JSON-lines inventory ({exc.reason})") from None
    if skipped and not requests:  # (a CI warm step given the wrong file, or a newer one, must fail)
        raise CliError(f"{args.inventory}: no line is a request of this safejit's inventory ({len(skipped)} read)")
    if skipped:
        out.warn(f"{args.inventory}: {len(skipped)} line(s) that are no request skipped (first: line {skipped[0]})")
    results: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool,
        out.progress("warming", len(requests)) as done,
    ):
        roots = tuple(args.source_root)
        futures = [
            pool.submit(_warm_one, args.cache_dir, roots, r.data, remote, signing_key, args.verbose) for r in requests
        ]
        for n, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            done(n)
    bad = [r for r in results if r["result"] in ("failed", "skipped") or r["upload"] in UPLOAD_FAILURES]
    if args.json:
        out.json({"requests": len(requests), "remote": remote is not None, "results": results})
    elif remote is None:
        _summary(out, results)
    else:
        _remote_report(out, results)
    return EXIT_FINDINGS if bad else EXIT_OK


def _count(values: list[str]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _summary(out: Out, results: list[dict[str, Any]]) -> None:
    for r in results:
        if r["result"] == "failed":
            _failed(out, r)
    out.line(f"{len(results)} requests: " + _count([r["result"] for r in results]))
    _skipped(out, results)


def _skipped(out: Out, results: list[dict[str, Any]]) -> None:
    """Each request skipped, with the roots it names and those declared here."""
    skipped = sorted((r for r in results if r["result"] == "skipped"), key=lambda r: r["name"])
    if skipped:
        out.line((f"skipped {len(skipped)}: {SKIPPED_WHY}", "warn"))
    for r in skipped:
        out.line(f"    {r['name']}: {r['detail']}")


def _failed(out: Out, r: dict[str, Any]) -> None:
    """A failed request and its error, the compiler's log a line each (indented: a line
    of the log cannot pass for one of this report's)."""
    first, *rest = str(r["detail"]).splitlines() or [""]
    out.line((f"failed: {r['name']}: {first}", "bad"))
    for line in rest:
        out.line("    " + line)


def _remote_report(out: Out, results: list[dict[str, Any]]) -> None:
    """One row per request: what it was (compiled, disk hit, remote hit) and what became
    of its upload; then the failures' details."""
    ordered = sorted(results, key=lambda r: r["name"])
    rows = [(r["name"], SHOWN.get(r["result"], r["result"]), _upload_cell(r)) for r in ordered]
    out.table(("KERNEL", "RESULT", "UPLOAD"), rows, shrink={0, 2})
    for r in ordered:
        if r["result"] == "failed":
            _failed(out, r)
        elif r["upload"] in UPLOAD_FAILURES:
            out.line((f"upload of {r['name']} (tenant {r['tenant']}): {_upload_cell(r)}: {r['upload_detail']}", "bad"))
    shown = [SHOWN.get(r["result"], r["result"]) for r in results]
    uploads = [_upload_cell(r) for r in results if r["upload"]]
    out.line(f"{len(results)} requests: {_count(shown)}" + (f"; uploads: {_count(uploads)}" if uploads else ""))
    _skipped(out, results)


def _upload_cell(r: dict[str, Any]) -> str:
    if r["upload"] is None:
        return "-"
    shown = UPLOAD_SHOWN[r["upload"]]
    return f"{shown}: {r['upload_reason']}" if r["upload_reason"] else shown
