"""The Redis-protocol engine (Redis >= 7, Valkey >= 8, and compatible servers) through
redis-py (+ hiredis): explicit connect and socket timeouts, no automatic retries, no
handshake beyond AUTH, and every operation a single-key command or function (FCALL).

Deadlines: redis-py bounds each socket wait by the connection's ``socket_timeout``, so
connections are pooled per deadline class (the floor, doubling up to the cap): a
transfer that needs 300 ms runs on a pool whose sockets wait at most 400 ms, a lookup
on one that waits at most the floor. Blob reads use ``GETRANGE key 0 cap`` so a value
over the cap is never read whole, and their replies are read straight off the socket,
the value received into the bytes object handed back (``_resp.Replies``); a lookup's index
read likewise, with the build key's head (every command single-key, pipelined) read
behind it in the same round trip. Both go on connections kept apart from the pool's
machinery (``_lane.Lane``).

redis-py is imported when a store is made, never by ``import safejit``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar, cast

from ... import faults
from ...errors import ConfigError
from . import codec
from ._engine import Engine
from ._functions import FUNCTIONS, SERVER_CODE
from ._guard import os_reason
from ._lane import Lane
from ._pending import PendingGet
from ._resolve import connection_class
from ._resp import Replies, pack
from .layout import check_hex, is_hex, split_entry
from .settings import RemoteSettings
from .store import (
    INDEX_BUDGET,
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
    import redis as _redis

__all__ = ["FUNCTIONS", "RedisStore"]

T = TypeVar("T")


#: The bytes of a head's value before its codec byte: the artifact's BLAKE3, raw.
HEAD_DIGEST: Final = 32

#: The most of a lease key's value read (a token is a holder's name, at most 200
#: characters, and 33 more): a larger value, which anyone who may write could set, is
#: never read whole.
LEASE_HOLDER_MAX: Final = 1024

#: SCAN pages read at most for one listing (a keyspace of 100 million keys, at SCAN_PAGE slots
#: a page): a server whose cursor never comes back to 0 would keep a listing going for good.
SCAN_PAGES_MAX: Final = 100_000

#: Keys asked for per SCAN call (the server examines about this many slots per call).
SCAN_PAGE: Final = 1000


#: Error replies of a server that is up but refuses writes now: out of memory under
#: ``noeviction``, a read-only replica, persistence failing (``stop-writes-on-bgsave-error``),
#: too few replicas (``min-replicas-to-write``). (redis-py raises the first two as their own
#: classes, the code cut off; a reply read here keeps it.)
_UNWRITABLE: Final = ("OOM ", "READONLY ", "MISCONF ", "NOREPLICAS ")


def classify(exc: BaseException) -> Reason:
    """The reason for a redis-py (or socket) exception."""
    import redis

    errors = redis.exceptions
    if isinstance(exc, errors.TimeoutError):
        return "timeout"
    if isinstance(exc, errors.AuthenticationError | errors.NoPermissionError):
        return "denied"
    if isinstance(exc, errors.ResponseError) and str(exc).startswith(("NOPERM", "WRONGPASS", "NOAUTH")):
        return "denied"
    if isinstance(exc, errors.ResponseError) and str(exc).startswith("ACL failure in"):
        return "denied"  # (a command a function ran that the user may not: no NOPERM prefix then)
    if isinstance(exc, errors.ResponseError) and str(exc).startswith("WRONGTYPE"):
        # (a key of another type where a value was looked for: stored data that does not
        # decode, from a server that is up; one such key must not open the breaker for all)
        return "corrupt"
    if isinstance(exc, errors.OutOfMemoryError | errors.ReadOnlyError) or (
        isinstance(exc, errors.ResponseError) and str(exc).startswith(_UNWRITABLE)
    ):
        # (a live server that refuses writes, full or a replica: a failure of every upload
        # that must not open the breaker in front of the reads it still answers)
        return "unwritable"
    found = os_reason(exc)
    if found is not None:
        return found
    if isinstance(exc, errors.ConnectionError) and "connecting to" in str(exc):
        return "refused" if "refused" in str(exc).lower() or "No such file" in str(exc) else "error"
    return "error"


def _put_of(got: object) -> Put:
    """The publish script's answer (1 created, 0 there already, -1 the index full); a
    reply of another type is the server's error (raised inside the guard)."""
    if type(got) is not int:
        raise TypeError(f"the publish script answered {type(got).__name__}, not an integer")
    return {1: Put.CREATED, 0: Put.EXISTS}.get(got, Put.FULL)


class RedisStore(Engine["_redis.Redis"]):
    """A :class:`~safejit.cache.remote.store.RemoteStore` on a Redis-protocol server."""

    engine: ClassVar[str] = "redis"

    _classify = staticmethod(classify)

    def _open(self, settings: RemoteSettings) -> None:
        if settings.engine != "redis":
            raise ConfigError(f"RedisStore needs a redis://, rediss:// or unix:// URL, got {settings.url}")
        try:
            import redis
        except ImportError:
            raise ConfigError(f"the remote {settings.url} needs redis-py: pip install 'safejit[redis]'") from None
        self._redis = redis
        self._connection_class = connection_class(redis, settings)
        self._lanes: dict[float, Lane] = {}

    # -- connections ---------------------------------------------------------

    def client(self, nbytes: int = 0) -> _redis.Redis:
        """The client whose sockets wait at most the deadline of an ``nbytes`` transfer
        (also what the benchmark uses for its raw GETs)."""
        return self._pooled(nbytes, self._make_client)

    def _make_client(self, timeout: float) -> _redis.Redis:
        client = self._new_client(timeout)
        self._lanes[timeout] = Lane(client.connection_pool)
        return client

    def _new_client(self, timeout: float) -> _redis.Redis:
        redis = self._redis
        url = self.settings.url
        kwargs: dict[str, Any] = {
            "connection_class": self._connection_class,
            "db": url.db,
            "username": url.username,
            "password": url.password.reveal() if url.password else None,
            "socket_timeout": timeout,
            "socket_connect_timeout": self.settings.connect_timeout_s,
            "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0),
            "health_check_interval": 0,
            "protocol": 2,
        }
        if url.scheme == "unix":
            kwargs["path"] = url.path
        else:
            kwargs["host"] = url.host
            kwargs["port"] = url.port
        if url.scheme == "rediss":
            kwargs["ssl_cert_reqs"] = "required"
            kwargs["ssl_check_hostname"] = True
            if url.ca_certs:
                kwargs["ssl_ca_certs"] = url.ca_certs
        kwargs.update(_no_client_info(self._connection_class))
        pool = redis.ConnectionPool(**kwargs)
        # The client's own retry policy is the one redis-py applies to commands.
        return cast(
            "_redis.Redis", redis.Redis(connection_pool=pool, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
        )

    def _lane(self, nbytes: int) -> Lane:
        """The hot reads' connections of the client for an ``nbytes`` transfer."""
        key = self.settings.deadline_class(nbytes)
        lane = self._lanes.get(key)
        if lane is None:
            self.client(nbytes)  # (made with its lanes)
            lane = self._lanes.get(key)
            if lane is None:  # (closed meanwhile)
                raise RemoteError("error", "connect", "the store is closed", engine=self.engine)
        return lane

    def close(self) -> None:
        for client in self._drop_pools():
            _drop_client(client)
        self._lanes = {}  # (after: no lane is made once the pools are dropped)

    # -- index ---------------------------------------------------------------

    def index(self, build_key: str) -> Mapping[str, bytes]:
        return self._index(build_key, head=False)[0]

    def index_and_head(self, build_key: str) -> tuple[Mapping[str, bytes], PendingBlob | None]:
        if not self.settings.head_max_bytes:
            return self.index(build_key), None
        return self._index(build_key, head=True)

    def _index(self, build_key: str, *, head: bool) -> tuple[Mapping[str, bytes], PendingGet | None]:
        """The index (HGETALL) and, with ``head``, the head's read sent behind it in the
        same write: one round trip, the head's replies read later off the same connection
        (:class:`PendingGet`)."""
        self._guard.admit("index")
        settings = self.settings
        limit, entries, cap = settings.max_manifest_bytes, settings.index_cap, settings.head_max_bytes
        request = pack("HGETALL", self.layout.redis_idx(build_key))
        if head:
            request += PendingGet.request(self.layout.redis_head(build_key), cap, HEAD_DIGEST)
        lane = self._lane(cap + 1 if head else 0)
        kept: list[tuple[Any, Replies]] = []

        def exchange() -> list[tuple[bytes, bytes]]:
            conn = lane.take()
            try:
                conn._sock.sendall(request)
                # (the whole reply within its deadline, which grows with the sizes it announces)
                allow = settings.reply_deadline
                replies = Replies(self._redis, conn, time.monotonic() + allow(0), allow=allow)
                got = replies.pairs(limit, entries=entries, budget=INDEX_BUDGET * limit, exact=head)
            except BaseException:
                lane.drop(conn)  # (a reply left unread would be the next command's)
                raise
            if head:
                kept.append((conn, replies))  # (the head's replies follow on it)
            elif replies.drained:
                lane.give(conn)
            else:
                lane.drop(conn)
            return got

        pairs = self._guard.run("index", "remote.get", exchange, received=lambda r: sum(len(v) for _, v in r))
        out: dict[str, bytes] = {}
        for field, value in pairs:
            if split_entry(name := field.decode("ascii", "replace")) is not None:
                out[name] = value
        return out, (PendingGet.behind(self, lane, *kept[0], cap, skip=HEAD_DIGEST) if kept else None)

    def publish_manifest(self, build_key: str, entry: str, manifest: bytes) -> Put:
        key = self.layout.redis_idx(build_key)
        if split_entry(entry) is None:
            raise ValueError(f"remote index entry must be <deps key>[.<key id>], got {entry!r:.80}")
        self._check_manifest_size(manifest)
        self._guard.admit("publish")
        client = self.client(len(manifest))
        cap = self.settings.index_cap
        budget = INDEX_BUDGET * self.settings.max_manifest_bytes  # (what a read takes: no more)
        return self._guard.run(
            "publish",
            "remote.put",
            lambda: _put_of(SERVER_CODE["publish"](client, key, entry, manifest, cap, budget)),
            sent=len(manifest),
        )

    # -- blobs ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        self._guard.admit("has_blob")
        key = self.layout.redis_cas(digest)
        return self._exists(key)

    def _exists(self, key: str) -> bool:
        client = self.client()
        return bool(self._guard.run("has_blob", "remote.get", lambda: client.exists(key)))

    def get_blob(self, digest: str, *, size: int | None = None) -> memoryview | None:
        return self.start_blob(digest, size=size).result()

    def start_blob(self, digest: str, *, size: int | None = None) -> PendingBlob:
        self._guard.admit("get_blob")
        key = self.layout.redis_cas(digest)
        cap = self._read_cap(size)
        return PendingGet(self, key, cap)

    def _decoded(self, head: bytes, payload: bytes, cap: int) -> memoryview | None:
        if not head:
            return None  # absent (a stored value always has its codec byte)
        if len(payload) > cap:
            raise RemoteError("oversize", "get_blob", f"stored value over {cap + 1} bytes", engine=self.engine)
        # (A corrupt fault flips the codec byte, as it did when the value was read whole.)
        return codec.decode_parts(faults.mangle("remote.get", head), payload, max_bytes=cap)

    def put_blob(self, digest: str, data: bytes) -> Put:
        self._check_put_size(data)
        return self._put_once("put_blob", self.layout.redis_cas(digest), data)

    def put_head(self, build_key: str, digest: str, data: bytes) -> Put | None:
        if len(data) > self.settings.head_max_bytes:
            raise RemoteError("oversize", "put_head", f"{len(data)} bytes > head_max_bytes", engine=self.engine)
        # (its digest in front: a lookup whose leaf is another's tells from it, before it
        # decodes or hashes a byte)
        prefix = bytes.fromhex(check_hex(digest, "digest"))
        return self._put_once("put_head", self.layout.redis_head(build_key), data, prefix)

    def _put_once(self, op: str, key: str, data: bytes, prefix: bytes = b"") -> Put:
        settings = self.settings
        self._guard.admit(op)
        if len(data) >= settings.compress_min_bytes and self._exists(key):
            return Put.EXISTS  # SET NX would ship the whole value only to be refused
        blob = prefix + codec.encode(data, min_bytes=settings.compress_min_bytes, level=settings.compress_level)
        client = self.client(len(blob))
        done = self._guard.run(op, "remote.put", lambda: client.set(key, blob, nx=True), sent=len(blob))
        return Put.CREATED if done else Put.EXISTS

    # -- leases --------------------------------------------------------------

    def acquire_lease(self, build_key: str, holder: str = "", ttl_s: float | None = None) -> Lease | None:
        key = self.layout.redis_lease(build_key)
        ttl = check_ttl(self.settings.lease_ttl_s if ttl_s is None else ttl_s)
        token = new_token(holder)
        self._guard.admit("lease")
        client = self.client()
        ms = max(1, round(ttl * 1000))
        got = self._guard.run("lease", "remote.lease", lambda: client.set(key, token, nx=True, px=ms))
        return Lease(build_key, token, ttl) if got else None

    def renew_lease(self, lease: Lease) -> bool:
        key = self.layout.redis_lease(lease.build_key)
        self._guard.admit("lease")
        client = self.client()
        ms = max(1, round(lease.ttl_s * 1000))
        got = self._guard.run("lease", "remote.lease", lambda: SERVER_CODE["renew"](client, key, lease.token, ms))
        return bool(got)

    def release_lease(self, lease: Lease) -> bool:
        key = self.layout.redis_lease(lease.build_key)
        self._guard.admit("lease", releasing=True)
        with self._releasing(self.client, self._new_client, _drop_client) as client:
            got = self._guard.run("lease", "remote.lease", lambda: SERVER_CODE["release"](client, key, lease.token))
        return bool(got)

    def lease_holder(self, build_key: str) -> str | None:
        # Asked on every poll of a lease wait: read as the hot reads are (its first
        # LEASE_HOLDER_MAX bytes, the whole reply within its deadline), not through redis-py,
        # where a lease key of any size was read whole and a reply sent a byte at a time held
        # the read as long as it was long.
        self._guard.admit("lease_holder")
        request = pack("GETRANGE", self.layout.redis_lease(build_key), 0, LEASE_HOLDER_MAX - 1)
        lane = self._lane(0)

        def read() -> bytes:
            conn = lane.take()
            try:
                conn._sock.sendall(request)
                replies = Replies(self._redis, conn, time.monotonic() + self.settings.reply_deadline(LEASE_HOLDER_MAX))
                got = replies.bulk(LEASE_HOLDER_MAX, expect=48)
            except BaseException:
                lane.drop(conn)
                raise
            if replies.drained:
                lane.give(conn)
            else:
                lane.drop(conn)
            return got

        got = self._guard.run("lease_holder", "remote.get", read)
        return got.decode("utf-8", "replace") if got else None  # ("": no lease; a token is never empty)

    # -- listing (operators: ``safejit remote stats|ls|verify``) -----------------

    def scan(self, kind: ScanKind, *, limit: int) -> Iterator[Scanned]:
        """SCAN ... MATCH the kind's prefix, a page at a time, each page's sizes fetched
        in one pipelined round trip after it (HLEN of each index, STRLEN of each blob).
        SCAN may return a key twice: the names seen are remembered (at most ``limit``)."""
        prefix = self.layout.redis_prefix(kind)
        seen: set[str] = set()
        cursor = 0
        for _ in range(SCAN_PAGES_MAX):
            if len(seen) >= limit:
                return
            self._guard.admit("scan")
            page = functools.partial(self._page, self.client(), cursor, kind, prefix, seen, limit - len(seen))
            cursor, found = self._guard.run("scan", "remote.get", page)
            for name, size in found:
                seen.add(name)
                if size > 0:  # (0: gone since the SCAN)
                    yield Scanned(name, size)
            if cursor == 0:
                return
        raise RemoteError("error", "scan", f"SCAN did not end within {SCAN_PAGES_MAX} pages", engine=self.engine)

    @staticmethod
    def _page(
        client: _redis.Redis, cursor: int, kind: str, prefix: str, seen: set[str], room: int
    ) -> tuple[int, list[tuple[str, int]]]:
        """The next cursor, and up to ``room`` names not ``seen`` of one SCAN page with their sizes."""
        after, keys = cast("tuple[int, list[bytes]]", client.scan(cursor, match=prefix + "*", count=SCAN_PAGE))
        names = [k[len(prefix) :].decode("ascii", "replace") for k in keys]
        fresh = [n for n in dict.fromkeys(names) if is_hex(n) and n not in seen][:room]
        command = {"index": "hlen", "blob": "strlen", "head": "strlen"}.get(kind)
        if command is None or not fresh:
            return int(after), [(n, 1) for n in fresh]
        pipe = client.pipeline(transaction=False)
        for name in fresh:
            getattr(pipe, command)(prefix + name)
        # (a key of another type, WRONGTYPE, is there, its size unknown: reading it says why,
        # a finding of that key; it stopped the whole scan)
        sizes = []
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
                raise reply  # (NOPERM above all: another tenant's keys stay denied)
            sizes.append(1 if isinstance(reply, Exception) else int(reply))
        return int(after), list(zip(fresh, sizes, strict=True))

    def ping(self) -> None:
        self._guard.admit("ping")
        client = self.client()
        self._guard.run("ping", "remote.get", client.ping)


def _drop_client(client: _redis.Redis) -> None:
    client.close()
    client.connection_pool.disconnect()


def _no_client_info(connection_class: type) -> dict[str, Any]:
    """Keyword arguments that stop redis-py sending CLIENT SETINFO on connect (a round trip,
    and a command a least-privilege ACL user should not need): ``driver_info=None`` on
    redis-py >= 7.1, ``lib_name=None`` before it (now deprecated)."""
    # (the class's own __init__ and its bases' may take **kwargs only: the one that names
    # the parameters is further up; inspect.signature of the class saw none, and redis-py
    # sent SETINFO on every connect)
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        if "driver_info" in params:
            return {"driver_info": None}
        if "lib_name" in params:
            return {"lib_name": None, "lib_version": None}
    return {}
