"""The remote tier's engine layer: everything that talks to a Redis-protocol server or
to S3-compatible object storage, behind one small protocol (:class:`RemoteStore`).

What it owns: parsing the remote URL (credentials redacted wherever they could be
printed), the frozen :class:`RemoteSettings`, the key layout, the stored form of an
artifact (1-byte codec header, zstd above 64 KiB, capped decompression), the circuit
breaker, and the two engines (``redis.py``, whose hot replies ``_resp.py`` reads off
the socket of connections ``_lane.py`` keeps, a blob read under way being ``_pending.py``'s,
its connections made by ``_resolve.py``'s class (the name resolved within the connect
deadline; what redis-py reads itself, the handshake included, within whole-reply
deadlines ``_watchdog.py`` enforces) and the code it runs on the server
``_functions.py``'s, and ``s3.py``; their base ``_engine.py``).
Every failure is a :class:`RemoteError` with a reason from :data:`REASONS`. What it
does not do: decide whether a leaf may be used (the remote tier verifies manifests and
artifacts against local files), or read the environment (credentials are passed in).

Nothing here imports redis-py, obstore or zstandard until a store is opened or a
compressed value is coded.

>>> settings = RemoteSettings.from_url("redis://127.0.0.1:6379/0")
>>> store = open_store(settings, tenant="team-a", backend="cuda")   # doctest: +SKIP
>>> store.index(build_key)                                          # doctest: +SKIP
{'<deps key>': b'{...manifest...}'}
>>> store.get_blob(digest, size=manifest_size)                      # doctest: +SKIP
b'...artifact...'
>>> [s.name for s in store.scan("index", limit=10)]                 # doctest: +SKIP
['<build key>', ...]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .breaker import Breaker, BreakerPolicy, Transition
from .layout import Layout
from .lease import LeaseKeeper
from .settings import RemoteSettings
from .store import REASONS, SCAN_KINDS, Lease, OpObserver, Put, Reason, RemoteError, RemoteStore, ScanKind, Scanned
from .url import RemoteURL, Secret, parse_url

if TYPE_CHECKING:
    from .redis import RedisStore
    from .s3 import S3Store

__all__ = [
    "REASONS",
    "SCAN_KINDS",
    "Breaker",
    "BreakerPolicy",
    "Layout",
    "Lease",
    "LeaseKeeper",
    "OpObserver",
    "Put",
    "Reason",
    "RemoteError",
    "RemoteSettings",
    "RemoteStore",
    "RemoteURL",
    "ScanKind",
    "Scanned",
    "Secret",
    "open_store",
    "parse_url",
]


def open_store(
    settings: RemoteSettings,
    *,
    tenant: str,
    backend: str,
    breaker: Breaker | None = None,
    on_transition: Transition | None = None,
    observer: OpObserver | None = None,
) -> RemoteStore:
    """The engine for ``settings.url`` (no I/O: connections open on first use). A missing
    client library is a ``ConfigError`` naming the extra to install."""
    engine: type[S3Store | RedisStore]
    if settings.engine == "s3":
        from .s3 import S3Store as engine
    else:
        from .redis import RedisStore as engine
    return engine(
        settings, tenant=tenant, backend=backend, breaker=breaker, on_transition=on_transition, observer=observer
    )
