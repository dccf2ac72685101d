"""The S3-compatible engine, through obstore (the Rust ``object_store`` client): no
retries, explicit connect and request timeouts, write-once puts as
``PUT If-None-Match: *`` (``mode="create"``), and range reads capped at the limit.

The layout mirrors Redis (see ``layout``): a manifest is one object under
``idx/<K>/``, so an index lookup is one LIST (a miss costs that one round trip; a hit
adds one GET per leaf). S3 has no TTL, so a lease is an object holding its token and
an expiry time; it is taken over, renewed and released by conditional puts on its
ETag (``If-Match``), never deleted. Lease expiry compares wall clocks across nodes: a
skewed clock costs at most a duplicate compile (leases are for efficiency only).

Credentials: the URL's userinfo (access key id and secret) or the caller's; with
none, obstore's default chain applies (its own ``AWS_*`` variables, instance or pod
identity). obstore is imported when a store is made, never by ``import safejit``.

(Over the style's 400 lines: one class, the engine, whose every operation crosses the
one boundary ``_run``; its lease protocol and its listing are what S3 lacks natively.)
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from ... import faults
from ...errors import ConfigError
from . import codec
from ._engine import Engine
from ._guard import os_reason
from .layout import is_hex, split_entry
from .settings import RemoteSettings
from .store import (
    INDEX_BUDGET,
    Deferred,
    Lease,
    PendingBlob,
    Put,
    Reason,
    RemoteError,
    ScanKind,
    Scanned,
    check_ttl,
    new_token,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config, S3Credential

    from .url import Secret

__all__ = ["S3Store"]

T = TypeVar("T")
_LEASE_BODY_LIMIT: Final = 4096
#: Objects asked for per LIST page (S3's largest page).
SCAN_PAGE: Final = 1000
#: What a scan may pass over that is not the cache's, for each entry it is asked for, and
#: at least (``S3Store._ours``).
_JUNK_PER_ITEM: Final = 16
_JUNK_MIN: Final = 64
#: The pages of an index's listing read at most (objects other than leaves fill pages too).
_INDEX_PAGES: Final = 4
#: A concurrent conditional write to the same key (409 ConditionalRequestConflict) is retried once.
_CONFLICT_RETRIES: Final = 1
#: What a GET receives at a time, at most (``_get``).
_PIECE: Final = 4 << 20


#: obstore runs requests on a tokio runtime, whose threads a forked child does not have:
#: in a child forked after the parent made a request, every request would hang. Such a
#: child fails fast instead (each S3 operation is the reason ``error``); start workers
#: with ``spawn`` or ``forkserver``, or open the remote in each worker.
_used = False
_forked_after_use = False
_FORK_MESSAGE: Final = "obstore cannot run in a process forked after it was used; use spawn or forkserver"


def _on_fork_in_child() -> None:
    global _forked_after_use
    _forked_after_use = _forked_after_use or _used


os.register_at_fork(after_in_child=_on_fork_in_child)


def classify(exc: BaseException) -> Reason:
    """The reason for an obstore (or socket) exception. obstore reports transport
    failures as ``GenericError`` whose text names reqwest's error kind."""
    from obstore import exceptions as errors

    if isinstance(exc, errors.PermissionDeniedError | errors.UnauthenticatedError | PermissionError):
        return "denied"
    text = str(exc)
    if "TimedOut" in text or "kind: Timeout" in text or "timed out" in text:
        return "timeout"
    if "ConnectionRefused" in text or "Connection refused" in text:
        return "refused"
    if "403 Forbidden" in text or "401 Unauthorized" in text or "AccessDenied" in text:
        return "denied"
    if "507 Insufficient Storage" in text or "StorageFull" in text:
        return "unwritable"  # (a full store, MinIO's XMinioStorageFull: it still serves reads)
    if _NO_BUCKET in text:
        return "error"  # (a 404 as a missing object's, but nothing is there to find: not "refused")
    return os_reason(exc) or "error"


#: The error code of a request to a bucket that does not exist (its 404 is a missing
#: object's otherwise; a HEAD's carries no body to tell them apart).
_NO_BUCKET: Final = "<Code>NoSuchBucket</Code>"


def _absent(exc: FileNotFoundError) -> bool:
    """Whether a 404 says the object is absent (not that the bucket is)."""
    return _NO_BUCKET not in str(exc)


class S3Store(Engine[Any]):
    """A :class:`~safejit.cache.remote.store.RemoteStore` on S3-compatible object storage."""

    engine: ClassVar[str] = "s3"

    _classify = staticmethod(classify)

    def _describe(self, exc: BaseException) -> str | None:
        if _NO_BUCKET in str(exc):
            return f"the bucket {self.settings.url.host!r} does not exist (NoSuchBucket)"
        return None

    def _open(self, settings: RemoteSettings) -> None:
        if settings.engine != "s3":
            raise ConfigError(f"S3Store needs an s3:// URL, got {settings.url}")
        try:
            import obstore
        except ImportError:
            raise ConfigError(f"the remote {settings.url} needs obstore: pip install 'safejit[s3]'") from None
        self._obstore = obstore
        self._connected = False

    # -- plumbing ------------------------------------------------------------

    def _store(self, nbytes: int = 0) -> Any:
        """The obstore store whose requests time out at the deadline of an ``nbytes``
        transfer (one HTTP client per deadline class: obstore fixes it per store)."""
        return self._pooled(nbytes, self._make_store)

    def _make_store(self, timeout: float) -> Any:
        from obstore.store import S3Store as _ObStore

        url = self.settings.url
        config: S3Config = {}
        if url.endpoint:
            config["endpoint"] = url.endpoint
        if url.region:
            config["region"] = url.region
        provider = None
        if url.username is not None and url.password is not None:
            # The key safejit chose, with its own session token or none: obstore would add
            # what the environment holds to a key of the config (AWS_SESSION_TOKEN, sent to
            # whatever endpoint the URL names; AWS_SKIP_SIGNATURE, every request unsigned).
            # A provider's credential is the whole of it, and the config says sign, in full.
            provider = _StaticCredential(url.username, url.password, url.session_token)
            config["skip_signature"] = False
            config["unsigned_payload"] = False
        client: ClientConfig = {
            "timeout": timedelta(seconds=timeout),
            "connect_timeout": timedelta(seconds=self.settings.connect_timeout_s),
            "allow_http": bool(url.endpoint and url.endpoint.startswith("http://")),
        }
        retry: RetryConfig = {"max_retries": 0, "retry_timeout": timedelta(seconds=timeout)}
        try:
            return _ObStore(
                url.host,
                prefix=url.path or None,
                config=config,
                client_options=client,
                retry_config=retry,
                credential_provider=provider,
            )
        except Exception as exc:
            raise ConfigError(f"the remote {url} cannot be configured: {self.settings.redact(str(exc))}") from None

    def _run(
        self, op: str, point: str, fn: Callable[[], T], *, sent: int = 0, received: Callable[[T], int] | None = None
    ) -> T:
        global _used
        if _forked_after_use:
            raise RemoteError("error", op, _FORK_MESSAGE, engine=self.engine)
        _used = True

        def call() -> T:
            if not self._connected:
                faults.point("remote.connect")
            try:
                result = fn()
            except Exception:
                self._connected = False
                raise
            self._connected = True
            return result

        return self._guard.run(op, point, call, sent=sent, received=received)

    def _get(self, store: Any, path: str, limit: int) -> tuple[bytes, int, str] | None:
        """``(at most limit + 1 bytes, full size, etag)`` of ``path``, or ``None`` if absent."""
        from obstore import exceptions as errors

        try:
            result = self._obstore.get(store, path, options={"range": (0, limit + 1)})
        except FileNotFoundError as exc:
            if not _absent(exc):
                raise
            return None
        except errors.GenericError as exc:
            if "416 Range Not Satisfiable" in str(exc):
                return (b"", 0, "")  # an empty object: no range of it exists
            raise
        meta = result.meta
        # Read a piece at a time, never past the range asked for and a byte: a server that
        # sends more than it says it does (a 206 whose body runs on) is never buffered whole.
        pieces, have = [], 0
        for piece in result.stream(min_chunk_size=min(limit + 2, _PIECE)):
            pieces.append(piece)
            have += len(piece)
            if have > limit + 1:
                break  # (the rest dropped with the response: the callers see the value too long)
        body = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        return body, int(meta["size"]), str(meta.get("e_tag") or "")

    def _create(self, store: Any, path: str, data: bytes) -> Put:
        """``PUT If-None-Match: *``: CREATED or EXISTS."""
        from obstore import exceptions as errors

        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self._obstore.put(store, path, data, mode="create", use_multipart=False)
            except errors.AlreadyExistsError:
                return Put.EXISTS
            except errors.GenericError as exc:
                if "409 Conflict" not in str(exc) or attempt == _CONFLICT_RETRIES:
                    raise
                continue
            return Put.CREATED
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._drop_pools()

    # -- index ---------------------------------------------------------------

    def index(self, build_key: str) -> Mapping[str, bytes]:
        self._guard.admit("index")
        prefix = self.layout.s3_idx_dir(build_key)
        store = self._store()
        limit = self.settings.max_manifest_bytes
        manifest_store = self._store(limit)

        def fetch() -> dict[str, bytes]:
            # One LIST (all a miss costs), then one GET per leaf listed, at most index_cap:
            # the first index_cap objects named as leaves are (anything else under the
            # prefix, a writer's junk, is passed over, never counted), and no page is
            # listed past them. As on Redis, the leaves' bytes in all are within the
            # index budget (past it nothing more is read: oversize), and the whole read
            # within one deadline (each request has its own, but up to 64 of them).
            settings = self.settings
            started, budget = time.monotonic(), INDEX_BUDGET * limit
            leaves = [(path, size) for path, size in self._leaves(store, prefix) if size <= limit]
            listed = sum(size for _, size in leaves)
            if listed > budget:
                raise RemoteError(
                    "oversize", "index", f"entries of {listed} bytes in all, over {budget}", engine=self.engine
                )
            ends = started + max(settings.timeout_max_s, settings.reply_deadline(listed))
            out: dict[str, bytes] = {}
            total = 0
            for path, _ in leaves:
                if time.monotonic() > ends:
                    raise RemoteError(
                        "timeout", "index", f"{len(out)} of {len(leaves)} entries read in time", engine=self.engine
                    )
                got = self._get(manifest_store, path, limit)
                if got is not None and len(got[0]) <= limit and got[1] <= limit:
                    total += len(got[0])  # (rewritten since listed: counted as read)
                    if total > budget:
                        raise RemoteError(
                            "oversize", "index", f"entries of more than {budget} bytes in all", engine=self.engine
                        )
                    out[path[len(prefix) : -len(".json")]] = got[0]
            return out

        return self._run("index", "remote.get", fetch, received=lambda r: sum(len(v) for v in r.values()))

    def index_and_head(self, build_key: str) -> tuple[Mapping[str, bytes], PendingBlob | None]:
        # (no heads: a lookup's requests cannot share a round trip here; the blob is asked for
        # while the closure is checked)
        return self.index(build_key), None

    def put_head(self, build_key: str, digest: str, data: bytes) -> Put | None:
        return None

    def publish_manifest(self, build_key: str, entry: str, manifest: bytes) -> Put:
        path = self.layout.s3_idx(build_key, entry)
        self._check_manifest_size(manifest)
        prefix = self.layout.s3_idx_dir(build_key)
        self._guard.admit("publish")
        store = self._store(len(manifest))

        def publish() -> Put:
            # The cap is checked, then the put is conditional: concurrent writers may overshoot
            # the cap by their number, never overwrite. (Only leaves count.)
            listed = dict(self._leaves(store, prefix, limit=self.settings.index_cap + 1))
            if path in listed:
                return Put.EXISTS
            budget = INDEX_BUDGET * self.settings.max_manifest_bytes  # (what a read takes: no more)
            if len(listed) >= self.settings.index_cap or sum(listed.values()) + len(manifest) > budget:
                return Put.FULL
            return self._create(store, path, manifest)

        return self._run("publish", "remote.put", publish, sent=len(manifest))

    def _leaves(self, store: Any, prefix: str, *, limit: int | None = None) -> Iterator[tuple[str, int]]:
        """``(path, size)`` of the first ``limit`` (default ``index_cap``) objects under an
        index's ``prefix`` named as leaves (``<deps key>.json``), listed a page at a time
        and no page further."""
        wanted = self.settings.index_cap if limit is None else limit
        if wanted <= 0:
            return
        for pages, page in enumerate(self._obstore.list(store, prefix, chunk_size=SCAN_PAGE)):
            if pages == _INDEX_PAGES:  # (a prefix filled with other objects: no listing without end)
                return
            for meta in page:
                path = str(meta["path"])
                name = path[len(prefix) : -len(".json")]
                if path.startswith(prefix) and path.endswith(".json") and split_entry(name) is not None:
                    yield path, int(meta["size"])
                    wanted -= 1
                    if wanted == 0:
                        return

    # -- blobs ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        self._guard.admit("has_blob")
        path = self.layout.s3_cas(digest)
        return self._exists(path)

    def _exists(self, path: str) -> bool:
        store = self._store()

        def head() -> bool:
            try:
                self._obstore.head(store, path)
            except FileNotFoundError:
                return False
            return True

        return self._run("has_blob", "remote.get", head)

    def get_blob(self, digest: str, *, size: int | None = None) -> memoryview | None:
        return self._get_blob(digest, self._blob_cap(size))

    def start_blob(self, digest: str, *, size: int | None = None) -> PendingBlob:
        # One GET, not split in two: nothing is asked before result().
        cap = self._blob_cap(size)
        return Deferred(lambda: self._get_blob(digest, cap))

    def _blob_cap(self, size: int | None) -> int:
        self._guard.admit("get_blob")
        return self._read_cap(size)

    def _get_blob(self, digest: str, cap: int) -> memoryview | None:
        path = self.layout.s3_cas(digest)
        wire_cap = cap + 1
        store = self._store(wire_cap)
        got = self._run(
            "get_blob", "remote.get", lambda: self._get(store, path, wire_cap), received=lambda r: len(r[0]) if r else 0
        )
        if got is None:
            return None
        blob, full, _ = got
        if full > wire_cap or len(blob) > wire_cap:
            raise RemoteError("oversize", "get_blob", f"stored value of {full} bytes > {wire_cap}", engine=self.engine)
        return codec.decode(faults.mangle("remote.get", blob), max_bytes=cap)

    def put_blob(self, digest: str, data: bytes) -> Put:
        path = self.layout.s3_cas(digest)
        settings = self.settings
        self._check_put_size(data)
        self._guard.admit("put_blob")
        if len(data) >= settings.compress_min_bytes and self._exists(path):
            return Put.EXISTS
        blob = codec.encode(data, min_bytes=settings.compress_min_bytes, level=settings.compress_level)
        store = self._store(len(blob))
        return self._run("put_blob", "remote.put", lambda: self._create(store, path, blob), sent=len(blob))

    # -- leases --------------------------------------------------------------

    def acquire_lease(self, build_key: str, holder: str = "", ttl_s: float | None = None) -> Lease | None:
        path = self.layout.s3_lease(build_key)
        ttl = check_ttl(self.settings.lease_ttl_s if ttl_s is None else ttl_s)
        token = new_token(holder)
        self._guard.admit("lease")
        store = self._store()

        def acquire() -> bool:
            if self._create(store, path, _lease_body(token, time.time() + ttl)) is Put.CREATED:
                return True
            current = self._read_lease(store, path)
            if current is None:
                return False  # deleted under us (by an operator): try again next time
            _, expires, etag = current
            if expires > time.time():
                return False
            return self._swap(store, path, etag, _lease_body(token, time.time() + ttl))

        return Lease(build_key, token, ttl) if self._run("lease", "remote.lease", acquire) else None

    def renew_lease(self, lease: Lease) -> bool:
        return self._update_lease(lease, time.time() + lease.ttl_s, lease.token)

    def release_lease(self, lease: Lease) -> bool:
        return self._update_lease(lease, 0.0, "", releasing=True)

    def lease_holder(self, build_key: str) -> str | None:
        self._guard.admit("lease_holder")
        path = self.layout.s3_lease(build_key)
        store = self._store()
        current = self._run("lease_holder", "remote.get", lambda: self._read_lease(store, path))
        if current is None or current[1] <= time.time() or not current[0]:
            return None
        return current[0]

    # -- listing (operators: ``safejit remote stats|ls|verify``) -----------------

    def scan(self, kind: ScanKind, *, limit: int) -> Iterator[Scanned]:
        """LIST under the kind's prefix, a page (1,000 objects) per round trip. S3 lists
        keys in UTF-8 binary order, so an index's objects (``idx/<K>/<D>.json``) come
        together and are counted as they pass; a lease object is read (its expiry) to
        tell whether it is held now."""
        if kind == "head":
            return  # (S3 keeps no heads)
        prefix = self.layout.s3_prefix(kind)
        store = self._store()
        found = (_scanned(kind, rest, size) for rest, size in self._listed(store, prefix))
        named = self._ours(found, _JUNK_PER_ITEM * limit + _JUNK_MIN, prefix)
        if kind == "index":
            named = ((name, sum(1 for _ in group)) for name, group in itertools.groupby(named, key=lambda e: e[0]))
        for name, size in itertools.islice(named, limit):
            yield Scanned(name, self._held(store, name) if kind == "lease" else size)

    def _ours(self, found: Iterator[tuple[str, int]], budget: int, prefix: str) -> Iterator[tuple[str, int]]:
        """The objects of ``found`` that are the cache's; past ``budget`` others (a writer's
        junk under the prefix), ``oversize``: a scan is bounded by what it asks for, not by
        what the bucket holds (a prefix of junk kept ``stats --limit 10`` listing for good)."""
        junk = 0
        for entry in found:
            if entry[0]:
                yield entry
                continue
            junk += 1
            if junk > budget:
                raise RemoteError(
                    "oversize",
                    "scan",
                    f"more than {budget} objects under {prefix} are no cache entries",
                    engine=self.engine,
                )

    def _listed(self, store: Any, prefix: str) -> Iterator[tuple[str, int]]:
        """``(key after prefix, size)`` of every object under ``prefix``, a page per round trip."""
        self._guard.admit("scan")
        stream = self._run("scan", "remote.get", lambda: self._obstore.list(store, prefix, chunk_size=SCAN_PAGE))
        while True:
            self._guard.admit("scan")
            page = self._run("scan", "remote.get", lambda: next(stream, None))
            if page is None:
                return
            for meta in page:
                yield str(meta["path"])[len(prefix) :], int(meta["size"])

    def _held(self, store: Any, build_key: str) -> int:
        path = self.layout.s3_lease(build_key)
        self._guard.admit("scan")
        current = self._run("scan", "remote.get", lambda: self._read_lease(store, path))
        return int(current is not None and bool(current[0]) and current[1] > time.time())

    def ping(self) -> None:
        self._guard.admit("ping")
        path = self.layout.s3_cas("0" * 64)
        store = self._store()

        def get() -> None:
            # (a GET, not a HEAD: a HEAD's 404 carries no body to say the bucket is missing)
            try:
                self._obstore.get(store, path, options={"range": (0, 1)})
            except FileNotFoundError as exc:
                if not _absent(exc):
                    raise

        self._run("ping", "remote.get", get)

    def _update_lease(self, lease: Lease, expires: float, token: str, *, releasing: bool = False) -> bool:
        """Write ``(token, expires)`` over the lease only while it holds ``lease.token``
        (``releasing``: letting it go, which a closed store still does)."""
        path = self.layout.s3_lease(lease.build_key)
        self._guard.admit("lease", releasing=releasing)

        def update(store: Any) -> bool:
            # As on Redis, where an expired lease is gone: only a live lease with our token.
            current = self._read_lease(store, path)
            if current is None or current[0] != lease.token or current[1] <= time.time():
                return False
            return self._swap(store, path, current[2], _lease_body(token, expires))

        if not releasing:
            store = self._store()
            return self._run("lease", "remote.lease", lambda: update(store))
        with self._releasing(self._store, self._make_store, lambda store: None) as store:
            return self._run("lease", "remote.lease", lambda: update(store))

    def _read_lease(self, store: Any, path: str) -> tuple[str, float, str] | None:
        got = self._get(store, path, _LEASE_BODY_LIMIT)
        if got is None:
            return None
        body, size, etag = got
        try:
            if size > _LEASE_BODY_LIMIT:
                raise ValueError("oversize")
            data = json.loads(body)
            token, expires = str(data["token"]), float(data["expires"])
            if not math.isfinite(expires):
                raise ValueError("expiry")
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # (float() of a huge
            # integer; a body nested thousands deep, which json.loads cannot parse)
            return ("", 0.0, etag)  # unreadable: treat as expired, so it can be taken over
        return (token, expires, etag)

    def _swap(self, store: Any, path: str, etag: str, body: bytes) -> bool:
        """``PUT If-Match: <etag>``: whether we replaced exactly that version."""
        from obstore import exceptions as errors

        if not etag:
            return False
        try:
            self._obstore.put(store, path, body, mode={"e_tag": etag}, use_multipart=False)
        except (errors.PreconditionError, errors.AlreadyExistsError, FileNotFoundError):
            return False
        except errors.GenericError as exc:
            if "409 Conflict" in str(exc):  # a concurrent conditional write won
                return False
            raise
        return True


class _StaticCredential:
    """obstore's credential provider for the key safejit chose: that key, its secret and
    its own session token (or none), never expiring; ``repr`` shows no secret."""

    __slots__ = ("_key", "_secret", "_token")

    def __init__(self, key: str, secret: Secret, token: Secret | None) -> None:
        self._key, self._secret, self._token = key, secret, token

    def __call__(self) -> S3Credential:
        token = self._token.reveal() if self._token is not None else None
        secret = self._secret.reveal()
        return {"access_key_id": self._key, "secret_access_key": secret, "token": token, "expires_at": None}

    def __repr__(self) -> str:
        return "_StaticCredential(***)"


def _scanned(kind: str, rest: str, size: int) -> tuple[str, int]:
    """``(name, size)`` of an object listed under a kind's prefix (``rest``: its key after
    the prefix); an empty name when it is not one of that kind's objects."""
    if kind == "index":
        build_key, _, leaf = rest.partition("/")
        ok = is_hex(build_key) and leaf.endswith(".json") and split_entry(leaf.removesuffix(".json")) is not None
        return (build_key, 1) if ok else ("", 0)
    if kind == "blob":
        shard, _, digest = rest.partition("/")
        return (digest, size) if is_hex(digest) and shard == digest[:2] else ("", 0)
    return (rest, 0) if is_hex(rest) else ("", 0)


def _lease_body(token: str, expires: float) -> bytes:
    return json.dumps({"token": token, "expires": expires}, separators=(",", ":")).encode()
