"""``safejit remote stats|ls|verify``: what a remote cache holds for a tenant and backend,
and whether its leaves would be used. Read-only: a user the server lets only read and
list (docs/remote.md, the auditor) runs all three; nothing is written, no lease taken.

Everything shown from the remote was written by others: names and errors go through
the one escaping sink (``_out``), long ones are cut, and a manifest that does not
decode is a finding, never a traceback."""

from __future__ import annotations

import argparse
import time
from typing import Any, Final

from ..cache.leaf import Manifest, ManifestError, decode_manifest
from ..cache.maintenance import leaf_id
from ..cache.remote import SCAN_KINDS, RemoteError, RemoteStore
from ..cache.remote.tier import RemoteTier
from ..closure.anchors import Anchors
from ..config import Config
from ..outcomes import Miss
from ..policy.trust import signature_policy, signer_of
from ..telemetry import ATTR
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, Finding, age_text, show_findings, size_text
from ._out import Out
from ._remote import (
    Entries,
    remote_config,
    remote_error,
    remote_finding,
    round_trip,
    shown_url,
    store_of,
    warn_password_in_argv,
)

__all__ = ["cmd_remote"]

#: The longest kernel name or key id shown (``ls --json`` too): a planted manifest may
#: hold 64 KiB in each.
TEXT_LIMIT: Final = 200


def cmd_remote(args: argparse.Namespace, out: Out) -> int:
    command = {"stats": _stats, "ls": _ls, "verify": _verify}[args.remote_command]
    warn_password_in_argv(args.remote, out)
    cfg = remote_config(args, mode="read-only")
    store = store_of(cfg)
    try:
        return command(args, out, cfg, store)
    finally:
        store.close()


def _header(store: RemoteStore) -> dict[str, Any]:
    return {"remote": shown_url(store), "engine": store.engine, "tenant": store.tenant, "backend": store.backend}


def _where(store: RemoteStore) -> str:
    return f"{shown_url(store)} (tenant {store.tenant}, backend {store.backend})"


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"


# -- stats --------------------------------------------------------------------------
def _stats(args: argparse.Namespace, out: Out, cfg: Config, store: RemoteStore) -> int:
    rtt = round_trip(store)
    counts, complete = _counts(store, args.limit)
    report = {
        **_header(store),
        "build_keys": counts["index"][0],
        "leaves": counts["index"][1],
        "blobs": counts["blob"][0],
        "blob_bytes": counts["blob"][1],
        "heads": counts["head"][0],
        "head_bytes": counts["head"][1],
        "leases_held": counts["lease"][1],
        "limit": args.limit,
        "complete": complete,
        "breaker": store.breaker.state,
        "round_trip_ms": round(rtt * 1e3, 3),
    }
    if args.json:
        out.json(report)
        return EXIT_OK
    out.line(("remote ", "bold"), (_where(store), "bold"))
    rows = [
        ("build keys", f"{report['build_keys']:,}"),
        ("leaves", f"{report['leaves']:,}"),
        ("blobs", f"{report['blobs']:,} ({size_text(report['blob_bytes'])} stored)"),
        ("heads", f"{report['heads']:,} ({size_text(report['head_bytes'])} stored, copies of blobs)"),
        ("leases held", f"{report['leases_held']:,}"),
        ("breaker", report["breaker"]),
        ("round trip", f"{rtt * 1e3:.2f} ms"),
    ]
    for label, value in rows:
        out.line(f"  {label:<12} {value}")
    if not complete:
        out.line((f"stopped after {args.limit:,} keys of a kind (--limit): counts are lower bounds", "warn"))
    return EXIT_OK


def _counts(store: RemoteStore, limit: int) -> tuple[dict[str, tuple[int, int]], bool]:
    """``{kind: (keys, sum of their sizes)}``, at most ``limit`` keys of each kind, and
    whether every key was counted."""
    counts: dict[str, tuple[int, int]] = {}
    complete = True
    try:
        for kind in SCAN_KINDS:
            n = total = 0
            for found in store.scan(kind, limit=limit + 1):
                if n == limit:
                    complete = False
                    break
                n, total = n + 1, total + found.size
            counts[kind] = (n, total)
    except RemoteError as exc:
        raise remote_error(store, exc) from None
    return counts, complete


# -- ls -----------------------------------------------------------------------------
def _ls(args: argparse.Namespace, out: Out, cfg: Config, store: RemoteStore) -> int:
    round_trip(store)
    findings: list[Finding] = []
    entries = Entries(store, args.limit, findings)
    listed = _decoded(entries, findings)
    status = EXIT_FINDINGS if findings else EXIT_OK
    if args.json:
        leaves = [_leaf_json(*x) for x in listed]
        found = [f.as_json() for f in findings]
        out.json(
            {**_header(store), "limit": args.limit, "complete": entries.complete, "leaves": leaves, "findings": found}
        )
        return status
    if listed:
        now = time.time()
        rows = [
            (
                leaf_id(k, d),
                _cut(m.name) if m else "?",
                size_text(m.artifact_size) if m else "?",
                _cut(_signer(m)) if m else "?",
                age_text(now - m.created) if m else "?",
            )
            for k, d, m in listed
        ]
        out.table(("ID", "KERNEL", "SIZE", "SIGNER", "CREATED"), rows, right={2, 4}, shrink={1, 3})
    out.line(f"{len(listed)} leaves of {entries.build_keys} build keys on {_where(store)}")
    if not entries.complete:
        out.line((f"stopped at {args.limit:,} leaves (--limit): there are more", "warn"))
    show_findings(out, findings)
    return status


def _decoded(entries: Entries, findings: list[Finding]) -> list[tuple[str, str, Manifest | None]]:
    """Each entry with its manifest (None, and a finding, when it does not decode), by
    kernel name and newest first."""
    listed: list[tuple[str, str, Manifest | None]] = []
    for build_key, deps_key, raw in entries:
        try:
            man: Manifest | None = decode_manifest(raw)
        except ManifestError as exc:
            man = None
            findings.append(remote_finding(build_key, deps_key, "manifest", f"the manifest does not decode: {exc}"))
        listed.append((build_key, deps_key, man))
    listed.sort(key=lambda x: (x[2].name if x[2] else "", -(x[2].created if x[2] else 0.0)))
    return listed


def _signer(man: Manifest) -> str:
    if man.signature is None:
        return "unsigned"
    return man.signature.key_id or man.signature.alg


def _leaf_json(build_key: str, entry: str, man: Manifest | None) -> dict[str, object]:
    signer = man.signature if man else None
    return {
        "id": leaf_id(build_key, entry),
        "build_key": build_key,
        "deps_key": entry[:64],
        "entry": entry,
        "kernel": _cut(man.name) if man else None,
        "bytes": man.artifact_size if man else None,
        "digest": man.artifact_digest if man else None,
        "signer": {"alg": _cut(signer.alg), "key_id": _cut(signer.key_id)} if signer else None,
        "created": man.created if man else None,
    }


# -- verify -------------------------------------------------------------------------
def _verify(args: argparse.Namespace, out: Out, cfg: Config, store: RemoteStore) -> int:
    round_trip(store)
    tier = _auditor(cfg, store)
    here = _Here(cfg) if args.local else None
    findings: list[Finding] = []
    entries = Entries(store, args.limit, findings)
    checked = failed = 0
    try:
        with out.status("verifying", follow_log=False) as update:
            for build_key, deps_key, raw in entries:
                bad = tier.audit(build_key, deps_key, raw, here.anchors(raw) if here else None)
                checked += 1
                update(f"verifying: {checked} leaves checked")
                if bad is None:
                    continue
                if bad.reason is Miss.CIRCUIT_OPEN:
                    raise CliError(f"{shown_url(store)}: the remote is failing (circuit breaker open)")
                failed += 1
                findings.append(remote_finding(build_key, deps_key, bad.reason.value, bad.detail or bad.reason.text))
    finally:
        if here is not None:
            here.close()
    status = EXIT_FINDINGS if findings else EXIT_OK
    if args.json:
        totals = {"checked": checked, "verified": checked - failed, "findings": [f.as_json() for f in findings]}
        out.json(
            {**_header(store), "local": bool(args.local), "limit": args.limit, "complete": entries.complete, **totals}
        )
        return status
    if not cfg.verify_keys and not cfg.signing_key:
        out.line(("no verify_keys configured (SAFEJIT_VERIFY_KEYS): no signature can be checked", "warn"))
    show_findings(out, findings)
    what = "manifest, names, deps key, signature, size, artifact" + (", closure here" if args.local else "")
    out.line(
        (f"{checked - failed}/{checked} remote leaves verify", "ok" if not failed else "bad"), f" on {_where(store)}"
    )
    out.line((f"checked: {what}", "dim"))
    if not entries.complete:
        out.line((f"stopped at {args.limit:,} leaves (--limit): there are more", "warn"))
    return status


def _auditor(cfg: Config, store: RemoteStore) -> RemoteTier:
    """A remote tier that reads only, checks signatures against ``verify_keys`` (an
    unsigned leaf is a finding) and takes no closure on trust (no stat memo)."""
    signer = signer_of(cfg.signing_key) if cfg.signing_key else None
    return RemoteTier(
        store,
        writable=False,
        verifier=signature_policy(cfg.verify_keys, signer, require=True),
        memo=None,
        max_artifact_bytes=cfg.max_artifact_bytes,
        attrs={ATTR.TENANT: store.tenant, ATTR.BACKEND: store.backend},
    )


class _Here:
    """This machine's anchors for a remote leaf, as a lookup here would have them: the
    declared source roots, and the roots of the toolchain this backend probes here for
    the leaf's language. Reaches into the Runtime's wiring (as ``explain`` does): the
    anchors are what the data path computes, not a copy of it."""

    def __init__(self, cfg: Config) -> None:
        from ..runtime import Runtime

        self._cfg = cfg.replace(remote=None)
        self._rt = Runtime(config=self._cfg)
        self._parts = self._rt._init()[0]

    def anchors(self, raw: bytes) -> Anchors:
        from ..spec import Source

        try:
            man = decode_manifest(raw)
            cxx = man.inputs is not None and man.inputs.language == "c++"
        except ManifestError:
            cxx = False  # (the audit finds the manifest undecodable before it needs these)
        probe = Source("", "probe", filename="probe.cc" if cxx else None)
        parts = self._parts
        return parts.anchors(parts.backend.toolchain(probe, parts.runner(self._cfg)))

    def close(self) -> None:
        self._rt.close()
