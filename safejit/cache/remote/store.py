"""The contract every remote engine meets: the :class:`RemoteStore` protocol, its
results (:class:`Put`, :class:`Lease`) and its one error, :class:`RemoteError`, whose
``reason`` comes from a fixed vocabulary (:data:`REASONS`).

Every operation is one single-key command (or one single-key script), so a store
works on Redis/Valkey Cluster unchanged. A failure of any kind leaves an operation as
a :class:`RemoteError` with a reason; nothing else escapes an engine (a caller
bug such as a malformed key is a ``ValueError``).

``RemoteError`` never leaves the remote tier: the tier turns it into a miss with its
reason (``safejit.cache.lookups{reason}``), so it is a plain exception, not part of the
public error tree.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args

from .breaker import Breaker
from .settings import RemoteSettings

__all__ = [
    "INDEX_BUDGET",
    "REASONS",
    "SCAN_KINDS",
    "Deferred",
    "Lease",
    "OpObserver",
    "PendingBlob",
    "Put",
    "Reason",
    "RemoteError",
    "RemoteStore",
    "ScanKind",
    "Scanned",
    "check_ttl",
    "new_token",
]

#: Why a remote operation failed:
#: ``timeout``      the server did not answer within the deadline (or connect timeout);
#: ``refused``      nothing listens there (connection refused, no such socket);
#: ``denied``       the server refused the credentials or the command/key (Redis NOPERM,
#:                  WRONGPASS; S3 401/403);
#: ``oversize``     a value over its cap (artifact, manifest, decompressed size);
#: ``corrupt``      the stored bytes do not decode (unknown codec, bad zstd frame);
#: ``unwritable``   the server is up but takes no writes now (Redis OOM at maxmemory, a
#:                  read-only replica, MISCONF, NOREPLICAS; S3 507): reads still work;
#: ``error``        anything else (connection reset mid-transfer, a server error reply);
#: ``circuit_open`` the breaker is open: the remote was not asked.
Reason = Literal["timeout", "refused", "denied", "oversize", "corrupt", "unwritable", "error", "circuit_open"]
REASONS: Final[frozenset[str]] = frozenset(get_args(Reason))


class RemoteError(Exception):
    """A remote operation failed; ``reason`` says why (one of :data:`REASONS`)."""

    # The message is built when shown, not when raised: with the breaker open, raising this
    # is most of what a skipped lookup costs.
    detail: str = ""
    engine: str = ""

    def __init__(self, reason: Reason, op: str, detail: str = "", *, engine: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown remote failure reason {reason!r}")
        self.reason: Reason = reason
        self.op = op
        if detail:
            self.detail = detail
        if engine:
            self.engine = engine

    def __str__(self) -> str:
        where = f"{self.engine} {self.op}" if self.engine else self.op
        return f"remote {where}: {self.reason}" + (f" ({self.detail})" if self.detail else "")

    def __repr__(self) -> str:
        return f"RemoteError({self.reason!r}, {self.op!r}, {self.detail!r}, engine={self.engine!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.reason, self.op, self.detail, self.engine))


def _rebuild(reason: Reason, op: str, detail: str, engine: str) -> RemoteError:
    return RemoteError(reason, op, detail, engine=engine)


class Put(enum.Enum):
    """The outcome of a write-once put."""

    CREATED = "created"
    #: The key was already there (first writer wins; the caller adopts what is there).
    EXISTS = "exists"
    #: The build key's index holds ``index_cap`` leaves already.
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease on a build key. ``token`` is unique to this holding; renew and release
    act only while the lease still holds this token."""

    build_key: str
    token: str
    ttl_s: float


#: What :meth:`RemoteStore.scan` lists: ``index``, this backend's build keys (one index
#: each); ``blob``, the tenant's artifacts; ``lease``, this backend's build leases;
#: ``head``, this backend's build keys' heads (none on S3).
ScanKind = Literal["index", "blob", "lease", "head"]
SCAN_KINDS: Final[tuple[ScanKind, ...]] = get_args(ScanKind)


@dataclass(frozen=True, slots=True)
class Scanned:
    """One key a scan found. ``name``: the build key (``index``, ``lease``) or the digest
    (``blob``). ``size``: an index's leaves; a blob's or a head's stored bytes (its codec
    byte, and a head's digest, included; compressed when stored so); a lease's 1 when it
    is held now, else 0."""

    name: str
    size: int


def new_token(holder: str = "") -> str:
    """A lease token, ``<holder>:<uuid4 hex>``: who holds it (for people reading the
    server) and a part unique to this holding."""
    if not isinstance(holder, str) or len(holder) > 200 or any(c in holder for c in "\r\n\0"):
        raise ValueError("a lease holder name must be a short string on one line")
    return f"{holder}:{uuid.uuid4().hex}" if holder else uuid.uuid4().hex


#: An index's manifests in all, in manifests' worth (``max_manifest_bytes``): what a
#: publish lets in, and what a read takes (past it, one a writer filled bypassing the
#: engine's publish, the read stops: oversize).
INDEX_BUDGET: Final = 8


def check_ttl(ttl_s: float) -> float:
    """``ttl_s`` if it is a usable lease lifetime (1 ms to a day), else ``ValueError``."""
    if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool) or not 0.001 <= ttl_s <= 86400:
        raise ValueError(f"a lease TTL must be between 0.001 and 86400 seconds, got {ttl_s!r}")
    return float(ttl_s)


class PendingBlob(Protocol):
    """A blob read under way (:meth:`RemoteStore.start_blob`). Exactly one of its methods
    is called, once: ``result()``, what ``get_blob`` would have returned or raised; or
    ``cancel()``, which drops the reply unread and never raises. After ``result()``,
    ``digest`` is the BLAKE3 (hex) of the very bytes it returned when the engine hashed
    them as they arrived, else None (the caller hashes them)."""

    @property
    def digest(self) -> str | None: ...
    def result(self, *, want: str | None = None) -> memoryview | None:
        """``want``: the digest a value stored with its own in front (a head) must name;
        one that names another is dropped unread (None)."""
        ...

    def cancel(self) -> None: ...


class Deferred:
    """A :class:`PendingBlob` that asks nothing until ``result()`` (for an engine whose
    reads cannot be split in two); it hashes nothing."""

    __slots__ = ("_read",)
    digest = None

    def __init__(self, read: Callable[[], memoryview | None]) -> None:
        self._read = read

    def result(self, *, want: str | None = None) -> memoryview | None:
        return self._read()

    def cancel(self) -> None:
        pass


class OpObserver(Protocol):
    """Told of every operation that reached the remote (for ``safejit.remote.duration{op}``
    and ``safejit.remote.bytes{direction}``): ``reason`` is ``None`` on success; ``sent`` and
    ``received`` count payload bytes. Exceptions it raises are logged and dropped."""

    def __call__(self, op: str, seconds: float, reason: str | None, sent: int, received: int) -> None: ...


class RemoteStore(Protocol):
    """One remote namespace: a tenant's CAS and one backend's index and leases.

    Key layout (Redis; S3 mirrors it with object keys, see ``layout``)::

        sj:v1:<tenant>:cas:<blake3>                      [1-byte codec][bytes]   write-once
        sj:v1:<tenant>:<backend>:idx:<K>   field <D>[.<key id>]  manifest bytes  write-once per (K, D, signer)
        sj:v1:<tenant>:<backend>:lease:<K>               lease token             SET NX PX
        sj:v1:<tenant>:<backend>:head:<K>     [32-byte BLAKE3][1-byte codec][bytes]  write-once (first leaf's)
    """

    @property
    def engine(self) -> str: ...
    @property
    def settings(self) -> RemoteSettings: ...
    @property
    def tenant(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def breaker(self) -> Breaker:
        """This client's circuit breaker (``state``: closed, open, half_open)."""
        ...

    def index(self, build_key: str) -> Mapping[str, bytes]:
        """Every leaf published under ``build_key``: ``{entry: manifest bytes}``, unverified
        (an entry is named ``<deps key>`` or ``<deps key>.<key id>``: ``layout.entry_name``).
        One round trip when the key is absent (Redis: always one). Entries over
        ``max_manifest_bytes`` or with a malformed name are left out."""
        ...

    def index_and_head(self, build_key: str) -> tuple[Mapping[str, bytes], PendingBlob | None]:
        """:meth:`index`, and the build key's head read in the same round trip: the decoded
        artifact :meth:`put_head` stored (any leaf's: unchecked), None if absent. The head's
        ``result()`` or ``cancel()`` is the caller's to call, once. ``(index, None)`` for an
        engine that keeps no heads (the caller fetches by digest)."""
        ...

    def publish_manifest(self, build_key: str, entry: str, manifest: bytes) -> Put:
        """Write-once: ``CREATED``, ``EXISTS`` (never overwritten) or ``FULL`` (index at cap).
        ``entry``: ``layout.entry_name`` of the manifest's deps key and signer."""
        ...

    def has_blob(self, digest: str) -> bool: ...

    def get_blob(self, digest: str, *, size: int | None = None) -> memoryview | None:
        """The decoded artifact stored under ``digest`` (a read-only view of the bytes
        received, not copied; ``bytes(view)`` copies), or ``None`` if absent. ``size``
        (the manifest's artifact size) caps what is read and scales the deadline; a stored
        value, compressed or not, over the cap is ``oversize`` and is never read whole.
        The bytes are not checked against ``digest``: that is the caller's job."""
        ...

    def start_blob(self, digest: str, *, size: int | None = None) -> PendingBlob:
        """:meth:`get_blob` in two halves: the request may go out now (Redis sends it), so
        that the bytes travel while the caller checks what it must check first; nothing
        of the reply is read, decoded or returned before ``result()``, and ``cancel()``
        drops it unread. The breaker and the size cap are checked here (``RemoteError``);
        a failure to send is raised by ``result()``."""
        ...

    def put_blob(self, digest: str, data: bytes) -> Put:
        """Write-once (``CREATED`` or ``EXISTS``); a large blob is not sent when it exists."""
        ...

    def put_head(self, build_key: str, digest: str, data: bytes) -> Put | None:
        """Keep ``data`` (the artifact of the build key's first leaf, at most
        ``settings.head_max_bytes``; ``digest``: its BLAKE3, stored in front of it) as the
        build key's head, write-once like a blob; None
        where the engine keeps no heads. The blob stays the artifact's home: a head only
        saves a lookup its second round trip."""
        ...

    def acquire_lease(self, build_key: str, holder: str = "", ttl_s: float | None = None) -> Lease | None:
        """The lease on ``build_key`` if nobody holds it (or its holder let it expire)."""
        ...

    def renew_lease(self, lease: Lease) -> bool:
        """Extend the lease by its TTL, only if still held by ``lease.token``."""
        ...

    def release_lease(self, lease: Lease) -> bool:
        """Give the lease up, only if still held by ``lease.token``."""
        ...

    def lease_holder(self, build_key: str) -> str | None:
        """The token of the live lease on ``build_key``, if any."""
        ...

    def scan(self, kind: ScanKind, *, limit: int) -> Iterator[Scanned]:
        """At most ``limit`` keys of ``kind`` in this namespace, each once, in no particular
        order (ask for one more than you will show to learn whether there are more).
        Read-only and paged: about a thousand keys per round trip, never the whole keyspace
        at once. Keys that are not well formed (not hex) and keys gone between the listing
        and their size are left out."""
        ...

    def ping(self) -> None:
        """One round trip that reads nothing (a liveness check, and a round-trip time)."""
        ...

    def close(self) -> None: ...
