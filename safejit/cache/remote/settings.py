"""RemoteSettings: one frozen value with everything an engine needs (address, timeouts,
size caps, lease TTL, compression threshold, breaker policy). No I/O, no environment.

Deadlines: connecting is bounded by ``connect_timeout_s``; each operation by
:meth:`RemoteSettings.deadline`, ``max(timeout_s, bytes / bytes_per_s)`` capped at
``timeout_max_s``. Every wait for the server (a connect, each read or write on the
socket, an HTTP request) is bounded by that deadline.

>>> s = RemoteSettings.from_url("redis://127.0.0.1:6379/0")
>>> s.deadline(0), s.deadline(100 << 20), s.deadline(1 << 30)
(0.05, 0.524288, 2.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from ...errors import ConfigError
from .breaker import BreakerPolicy
from .url import RemoteURL, Secret, parse_url

__all__ = ["DEFAULT_TIMEOUT_S", "RemoteSettings"]

_KiB: Final = 1 << 10
_MiB: Final = 1 << 20
#: The per-operation deadline floor by engine: a Redis answer takes well under a
#: millisecond in a data center; an S3 Standard one "tens of milliseconds" (AWS).
DEFAULT_TIMEOUT_S: Final = {"redis": 0.05, "s3": 0.5}


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    url: RemoteURL
    connect_timeout_s: float = 0.1
    #: The floor of every operation's deadline; ``None``: the engine's default.
    timeout_s: float | None = None
    timeout_max_s: float = 2.0
    #: The throughput a transfer's deadline assumes (bytes per second).
    bytes_per_s: float = 200e6
    #: The largest artifact stored or fetched (decompressed); a larger one is ``oversize``.
    max_bytes: int = 512 * _MiB
    #: The largest manifest (index entry) written or used.
    max_manifest_bytes: int = 1 * _MiB
    #: Index entries (leaves) per build key; a full index refuses more.
    index_cap: int = 64
    #: The largest artifact also kept as its build key's head (Redis): the first leaf's
    #: artifact, read in the same round trip as the index (a hit in one round trip, as
    #: REAPI inlines small outputs). Every lookup of a build key reads its head, up to
    #: this many bytes; 0: no heads.
    head_max_bytes: int = 1 * _MiB
    lease_ttl_s: float = 30.0
    #: Artifacts at least this large are stored zstd-compressed (when that makes them smaller).
    compress_min_bytes: int = 64 * _KiB
    compress_level: int = 1
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.url, RemoteURL):
            raise ConfigError("RemoteSettings.url must be a RemoteURL (see RemoteSettings.from_url)")
        if self.timeout_s is None:
            object.__setattr__(self, "timeout_s", DEFAULT_TIMEOUT_S[self.url.engine])
        for name in ("connect_timeout_s", "timeout_s", "timeout_max_s", "bytes_per_s", "lease_ttl_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not (0 < value < math.inf):
                raise ConfigError(f"remote {name} must be a positive number, got {value!r}")
        if not 0.001 <= self.lease_ttl_s <= 86400:  # (what a lease command takes: check_ttl)
            raise ConfigError(f"remote lease_ttl_s must be between 0.001 and 86400 seconds, got {self.lease_ttl_s!r}")
        if self.timeout_max_s < self.op_timeout_s:
            raise ConfigError("remote timeout_max_s must be at least timeout_s")
        for name in ("max_bytes", "max_manifest_bytes", "index_cap", "compress_min_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"remote {name} must be a positive integer, got {value!r}")
        if not isinstance(self.head_max_bytes, int) or isinstance(self.head_max_bytes, bool) or self.head_max_bytes < 0:
            raise ConfigError(f"remote head_max_bytes must be a non-negative integer, got {self.head_max_bytes!r}")
        if not isinstance(self.compress_level, int) or not 1 <= self.compress_level <= 19:
            raise ConfigError(f"remote compress_level must be in 1..19, got {self.compress_level!r}")
        if not isinstance(self.breaker, BreakerPolicy):
            raise ConfigError("RemoteSettings.breaker must be a BreakerPolicy")

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        username: str | None = None,
        password: str | Secret | None = None,
        session_token: str | Secret | None = None,
        **fields: Any,
    ) -> RemoteSettings:
        """Parse ``url`` (credentials in its userinfo, or passed here) and build the settings."""
        unknown = set(fields) - {f for f in cls.__dataclass_fields__ if f != "url"}
        if unknown:
            raise ConfigError(f"unknown remote setting(s): {sorted(unknown)}")
        parsed = parse_url(url, username=username, password=password, session_token=session_token)
        return cls(url=parsed, **fields)

    @property
    def engine(self) -> str:
        return self.url.engine

    @property
    def op_timeout_s(self) -> float:
        assert self.timeout_s is not None  # resolved in __post_init__
        return self.timeout_s

    def deadline(self, nbytes: int = 0) -> float:
        """Seconds allowed for one operation moving ``nbytes``."""
        return min(self.timeout_max_s, max(self.op_timeout_s, nbytes / self.bytes_per_s))

    def deadline_class(self, nbytes: int = 0) -> float:
        """The deadline an engine's connections for an ``nbytes`` transfer are set up with:
        :meth:`deadline` rounded up to the floor times a power of two (at most the cap), so
        that an engine keeps a handful of connection pools, not one per size."""
        want = self.deadline(nbytes)
        bucket = self.op_timeout_s
        while bucket < want:
            bucket *= 2
        return min(bucket, self.timeout_max_s)

    def reply_deadline(self, nbytes: int = 0) -> float:
        """Seconds a whole reply of ``nbytes`` may take to arrive (each wait for a piece of it
        is bounded by :meth:`deadline_class`): that, or for a large one twice the time its
        size takes at ``bytes_per_s`` (past ``timeout_max_s``, which bounds each wait)."""
        return max(self.deadline_class(nbytes), 2 * nbytes / self.bytes_per_s)

    def redact(self, text: str) -> str:
        return self.url.redact(text)
