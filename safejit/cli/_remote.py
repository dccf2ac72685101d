"""What the remote commands share: which remote, tenant and backend a command looks at
(``--remote``, ``--tenant``, ``--backend``, else the configuration), opening its store,
walking its index entries within a bound, and turning a remote failure into the command
line's error (exit 2, one line, credentials masked)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Final
from urllib.parse import urlsplit

from ..cache.maintenance import leaf_id
from ..cache.remote import RemoteError, RemoteStore, open_store
from ..config import Config
from ._common import CliError, Finding, config_for
from ._out import Out

__all__ = [
    "OPERATOR_TIMEOUT_S",
    "Entries",
    "remote_config",
    "remote_error",
    "remote_finding",
    "round_trip",
    "shown_url",
    "store_of",
    "warn_password_in_argv",
]

#: The floor of each operation's deadline for the operator commands, unless one is
#: configured (SAFEJIT_REMOTE_TIMEOUT_S): a person at a terminal, perhaps far from the
#: server, not a compile on its hot path.
OPERATOR_TIMEOUT_S: Final = 1.0
#: The longest detail a finding shows (a planted manifest's error may quote it).
DETAIL_LIMIT: Final = 300


def remote_config(args: argparse.Namespace, *, mode: str) -> Config:
    """The configuration with the remote ``--remote`` names (else ``SAFEJIT_REMOTE`` /
    ``Config.remote``), and ``--tenant``, ``--backend``, ``--cache-dir`` and
    ``--source-root`` where the command has them, in ``mode``."""
    cfg = config_for(
        getattr(args, "cache_dir", None),
        tenant=args.tenant,
        backend=args.backend,
        source_roots=tuple(getattr(args, "source_root", ())),
    )
    url = args.remote or cfg.remote
    if not url:
        raise CliError("no remote: give --remote URL, or set SAFEJIT_REMOTE")
    return cfg.replace(remote=url, remote_mode=mode)


def warn_password_in_argv(url: str | None, out: Out) -> None:
    """Warn when ``--remote``'s URL holds a password: a command line is seen by every user
    of the machine (``ps``, ``/proc/<pid>/cmdline``) and kept in shell history."""
    with contextlib.suppress(ValueError):
        if url and urlsplit(url).password:
            out.warn(
                "the --remote URL holds a password, which every user of this machine can read in its "
                "process list: give it in SAFEJIT_REMOTE_PASSWORD instead"
            )


def store_of(cfg: Config, *, timeout_s: float | None = OPERATOR_TIMEOUT_S) -> RemoteStore:
    """The store ``cfg`` names (no I/O yet), credentials from the URL or the environment;
    operations wait at least ``timeout_s`` unless the configuration sets a floor."""
    if cfg.remote_timeout_s is None and timeout_s is not None:
        cfg = cfg.replace(remote_timeout_s=timeout_s)
    settings = cfg.remote_settings(env=True)
    return open_store(settings, tenant=cfg.tenant, backend=cfg.backend)


def shown_url(store: RemoteStore) -> str:
    """The store's URL with its credentials masked."""
    return str(store.settings.url)


def remote_error(store: RemoteStore, exc: RemoteError) -> CliError:
    """The command's error for a failure that stops it: one line, the URL masked (the
    engine's detail was masked where it was raised)."""
    return CliError(f"{shown_url(store)}: {exc}")


def round_trip(store: RemoteStore, *, writes: bool = False) -> float:
    """Seconds one PING (S3: a HEAD) takes; a failure is the command's error — but for a
    command that only reads (not ``writes``), a server that takes no writes now (Redis
    answers PING with MISCONF while its snapshots fail) still answers its reads."""
    start = time.perf_counter()
    try:
        store.ping()
    except RemoteError as exc:
        if writes or exc.reason != "unwritable":
            raise remote_error(store, exc) from None
    return time.perf_counter() - start


def remote_finding(build_key: str, deps_key: str, reason: str, detail: str) -> Finding:
    """A finding about one remote leaf (``kind`` remote, ``path`` ``remote:<K>/deps-<D>``)."""
    if len(detail) > DETAIL_LIMIT:
        detail = detail[:DETAIL_LIMIT] + "…"
    path = f"remote:{build_key}/deps-{deps_key}" if deps_key else f"remote:{build_key}"
    return Finding("remote", path, reason, detail, leaf_id(build_key, deps_key) if deps_key else "")


class Entries:
    """The namespace's index entries ``(build key, entry name, manifest bytes)``, at most
    ``limit``, one index (one round trip) at a time. Reading an index that fails is a
    finding; so is an index that holds entries :meth:`RemoteStore.index` leaves out
    (over ``max_manifest_bytes``, or not named by a deps key). A failing listing, or the
    breaker opening, is the command's error. ``complete`` after the walk: whether every
    entry was seen."""

    def __init__(self, store: RemoteStore, limit: int, findings: list[Finding]) -> None:
        self.store = store
        self.limit = limit
        self.findings = findings
        self.complete = True
        self.build_keys = 0

    def __iter__(self) -> Iterator[tuple[str, str, bytes]]:
        seen = listed = 0
        try:
            for index in self.store.scan("index", limit=self.limit + 1):
                listed += 1
                if listed > self.limit:  # (every index holds a leaf: more than the limit)
                    self.complete = False
                    return
                entries = self._read(index.name)
                if entries is None:
                    continue
                self.build_keys += 1
                if len(entries) < index.size:
                    left = index.size - len(entries)
                    limit = self.store.settings.max_manifest_bytes
                    detail = f"{left} of {index.size} entries left out: over {limit} bytes, or not named as leaves"
                    self.findings.append(remote_finding(index.name, "", "manifest", detail))
                for deps_key, raw in sorted(entries.items()):
                    if seen >= self.limit:
                        self.complete = False
                        return
                    seen += 1
                    yield index.name, deps_key, raw
        except RemoteError as exc:
            raise remote_error(self.store, exc) from None

    def _read(self, build_key: str) -> dict[str, bytes] | None:
        try:
            return dict(self.store.index(build_key))
        except RemoteError as exc:
            if exc.reason == "circuit_open":
                raise
            self.findings.append(remote_finding(build_key, "", exc.reason, f"the index cannot be read: {exc}"))
            return None
