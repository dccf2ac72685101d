"""Every remote key name, for both engines (one home for the shapes), and the checks
that keep a tenant, backend or hash from reaching into another namespace.

Redis keys::

    sj:v1:<tenant>:cas:<blake3>
    sj:v1:<tenant>:<backend>:idx:<K>        (hash; field <entry>)
    sj:v1:<tenant>:<backend>:lease:<K>
    sj:v1:<tenant>:<backend>:head:<K>       (the first leaf's artifact, small ones only; its digest in front)

S3 object keys (under the URL's prefix)::

    v1/<tenant>/cas/<b3[:2]>/<b3>
    v1/<tenant>/<backend>/idx/<K>/<entry>.json
    v1/<tenant>/<backend>/lease/<K>

An index entry is named by its leaf's deps key ``<D>``, and for a signed manifest by the
signature's key id too, ``<D>.<key id>`` (:func:`entry_name`): entries are write-once per
leaf and signer, so a builder whose key was rotated publishes beside the old key's entry
instead of finding the leaf there already.

A tenant name cannot hold ``:``, ``/`` or a glob character, so the ACL pattern
``sj:v1:<tenant>:*`` (or the S3 prefix ``v1/<tenant>/``) covers that tenant only.

>>> layout = Layout("team-a", "cuda")
>>> layout.redis_idx("ab" * 32)[:40]
'sj:v1:team-a:cuda:idx:ababababababababab'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["SCHEMA", "Layout", "check_hex", "entry_name", "split_entry"]

SCHEMA: Final = "v1"
#: The same shape as ``Config.tenant``.
_TENANT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}\Z")
_BACKEND = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_HEX = re.compile(r"[0-9a-f]{64}\Z")
#: A signature's key id (``policy.trust``'s shape, pinned equal by a test).
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}\Z")


def check_hex(value: str, what: str) -> str:
    """``value`` if it is a 256-bit lowercase hex digest, else ``ValueError``."""
    if not isinstance(value, str) or not _HEX.match(value):
        raise ValueError(f"remote {what} must be 64 lowercase hex digits, got {value!r:.80}")
    return value


def is_hex(value: str) -> bool:
    return bool(_HEX.match(value))


def entry_name(deps_key: str, key_id: str = "") -> str:
    """The index entry of a leaf (``deps_key``) whose manifest is signed under ``key_id``
    ("" when unsigned): ``<D>`` or ``<D>.<key id>``.

    >>> entry_name("ab" * 32, "ed25519-0123456789abcdef")[-26:]
    'ab.ed25519-0123456789abcdef'
    """
    check_hex(deps_key, "deps key")
    if key_id and not _KEY_ID.match(key_id):
        raise ValueError(f"remote key id must match {_KEY_ID.pattern}, got {key_id!r:.80}")
    return f"{deps_key}.{key_id}" if key_id else deps_key


def split_entry(name: str) -> tuple[str, str] | None:
    """``(deps key, key id)`` of an index entry's name (:func:`entry_name`); None when it
    is not one."""
    deps_key, dot, key_id = name[:64], name[64:65], name[65:]
    if not _HEX.match(deps_key) or (dot and (dot != "." or not _KEY_ID.match(key_id))):
        return None
    return deps_key, key_id


@dataclass(frozen=True, slots=True)
class Layout:
    tenant: str
    backend: str

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not _TENANT.match(self.tenant):
            raise ValueError(f"remote tenant {self.tenant!r:.80} must match {_TENANT.pattern}")
        if not isinstance(self.backend, str) or not _BACKEND.match(self.backend):
            raise ValueError(f"remote backend {self.backend!r:.80} must match {_BACKEND.pattern}")

    # Redis
    @property
    def redis_tenant_prefix(self) -> str:
        return f"sj:{SCHEMA}:{self.tenant}:"

    def redis_cas(self, digest: str) -> str:
        return f"sj:{SCHEMA}:{self.tenant}:cas:{check_hex(digest, 'digest')}"

    def redis_idx(self, build_key: str) -> str:
        return f"sj:{SCHEMA}:{self.tenant}:{self.backend}:idx:{check_hex(build_key, 'build key')}"

    def redis_lease(self, build_key: str) -> str:
        return f"sj:{SCHEMA}:{self.tenant}:{self.backend}:lease:{check_hex(build_key, 'build key')}"

    def redis_head(self, build_key: str) -> str:
        return f"sj:{SCHEMA}:{self.tenant}:{self.backend}:head:{check_hex(build_key, 'build key')}"

    def redis_prefix(self, kind: str) -> str:
        """What every key of ``kind`` (``index``, ``blob``, ``lease``) starts with: a SCAN
        pattern with ``*`` appended (a tenant or backend name holds no glob character)."""
        return {
            "index": f"sj:{SCHEMA}:{self.tenant}:{self.backend}:idx:",
            "blob": f"sj:{SCHEMA}:{self.tenant}:cas:",
            "lease": f"sj:{SCHEMA}:{self.tenant}:{self.backend}:lease:",
            "head": f"sj:{SCHEMA}:{self.tenant}:{self.backend}:head:",
        }[kind]

    # S3
    @property
    def s3_tenant_prefix(self) -> str:
        return f"{SCHEMA}/{self.tenant}/"

    def s3_cas(self, digest: str) -> str:
        check_hex(digest, "digest")
        return f"{SCHEMA}/{self.tenant}/cas/{digest[:2]}/{digest}"

    def s3_idx_dir(self, build_key: str) -> str:
        return f"{SCHEMA}/{self.tenant}/{self.backend}/idx/{check_hex(build_key, 'build key')}/"

    def s3_idx(self, build_key: str, entry: str) -> str:
        if split_entry(entry) is None:
            raise ValueError(f"remote index entry must be <deps key>[.<key id>], got {entry!r:.80}")
        return f"{self.s3_idx_dir(build_key)}{entry}.json"

    def s3_lease(self, build_key: str) -> str:
        return f"{SCHEMA}/{self.tenant}/{self.backend}/lease/{check_hex(build_key, 'build key')}"

    def s3_prefix(self, kind: str) -> str:
        """The object prefix every key of ``kind`` (``index``, ``blob``, ``lease``) lies under."""
        return {
            "index": f"{SCHEMA}/{self.tenant}/{self.backend}/idx/",
            "blob": f"{SCHEMA}/{self.tenant}/cas/",
            "lease": f"{SCHEMA}/{self.tenant}/{self.backend}/lease/",
            "head": f"{SCHEMA}/{self.tenant}/{self.backend}/head/",  # (S3 keeps none: never listed)
        }[kind]
