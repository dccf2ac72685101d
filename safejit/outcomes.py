"""One vocabulary of outcomes: where a kernel came from, why a lookup missed, what
a publish did. The same members are the metric labels (``safejit.cache.lookups``
``reason``, ``safejit.publish.outcomes``), the keys of ``Runtime.stats()`` and the
text of ``Runtime.explain()`` — a way to miss *is* its counter, as in ccache.

Members are ``str`` enums: their values are the labels, stable across releases.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["CORRUPT", "Miss", "Outcome", "Tier"]


class Tier(StrEnum):
    """Where a returned kernel came from (``Artifact.tier``, the span's ``safejit.tier``)."""

    MEMORY = "memory"
    DISK = "disk"
    REMOTE = "remote"
    #: Compiled by this call (and published, unless the build could not be vouched for).
    COMPILED = "compiled"
    #: Compiled privately because the cache could not be used (``on_cache_error="bypass"``).
    BYPASS = "bypass"


class Miss(StrEnum):
    """Why a tier did not return a kernel. ``text`` explains it to a person."""

    ABSENT = "absent"
    STALE = "stale"
    GONE = "gone"
    MARKER = "marker"
    MANIFEST = "manifest"
    MISMATCH = "mismatch"
    ARTIFACT = "artifact"
    SIGNATURE = "signature"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    ANCHOR = "anchor"
    CONFINEMENT = "confinement"
    DEP_CHANGED = "dep_changed"
    DEP_MISSING = "dep_missing"
    DEP_SHADOWED = "dep_shadowed"
    DAMAGED = "damaged"
    IO = "io"
    OVERSIZE = "oversize"
    REMOTE_TIMEOUT = "timeout"
    REMOTE_REFUSED = "refused"
    REMOTE_DENIED = "denied"
    REMOTE_UNWRITABLE = "unwritable"
    REMOTE_ERROR = "error"
    CIRCUIT_OPEN = "circuit_open"

    @property
    def text(self) -> str:
        return _TEXT[self]

    @property
    def corrupt(self) -> bool:
        """Whether the leaf itself is damaged (moved aside), not merely outdated or unreadable."""
        return self in CORRUPT


_TEXT: Final = {
    Miss.ABSENT: "never built with these inputs (no leaf for this build key)",
    Miss.STALE: "a dependency changed since the entry was checked",
    Miss.GONE: "the leaf was removed meanwhile (prune)",
    Miss.MARKER: "the leaf is not committed",
    Miss.MANIFEST: "the manifest is damaged",
    Miss.MISMATCH: "the manifest names another leaf",
    Miss.ARTIFACT: "the artifact is missing or damaged",
    Miss.SIGNATURE: "the leaf's signature does not verify",
    Miss.UNSIGNED: "the leaf is not signed, and signatures are required",
    Miss.UNKNOWN_KEY: "the leaf is signed with a key this process does not know",
    Miss.ANCHOR: "a dependency root is not declared here",
    Miss.CONFINEMENT: "a dependency escapes its root",
    Miss.DEP_CHANGED: "a dependency changed",
    Miss.DEP_MISSING: "a dependency is missing",
    Miss.DEP_SHADOWED: "a new header shadows a dependency",
    Miss.DAMAGED: "the leaf is not a directory of regular files (a file or a symlink stands in its place)",
    Miss.IO: "the leaf cannot be read now (an I/O or permission error)",
    Miss.OVERSIZE: "the leaf's artifact is larger than the limit",
    Miss.REMOTE_TIMEOUT: "the remote did not answer in time",
    Miss.REMOTE_REFUSED: "nothing answers at the remote's address",
    Miss.REMOTE_DENIED: "the remote refused this user the key or the command",
    Miss.REMOTE_UNWRITABLE: "the remote takes no writes now (full, or a read-only replica)",
    Miss.REMOTE_ERROR: "the remote failed the request",
    Miss.CIRCUIT_OPEN: "the remote is failing: it was not asked (circuit breaker open)",
}

#: Misses that mean the leaf itself is damaged: it is quarantined, then rebuilt.
CORRUPT: Final = frozenset({Miss.MARKER, Miss.MANIFEST, Miss.MISMATCH, Miss.ARTIFACT, Miss.DAMAGED})


class Outcome(StrEnum):
    """What a publish did (``safejit.publish.outcomes``; ``Runtime.stats()`` counts them)."""

    PUBLISHED = "published"
    #: Another process published the same leaf first; its (verified) copy is used.
    ADOPTED = "adopted"
    QUARANTINED = "quarantined"
    FAILED = "failed"
    #: Built, but not vouched for (a dependency changed during the compile): not published.
    SKIPPED = "skipped"
    #: An existing leaf of that name could not be read: it is kept, this build not published.
    KEPT = "kept"
    #: Remote uploads (``safejit.remote.uploads``): copied; not copied (the build key's
    #: index is full, or ``warm --remote`` found the leaf there already); failed (the
    #: remote's error); dropped (the upload queue was full).
    UPLOADED = "uploaded"
    UPLOAD_SKIPPED = "upload_skipped"
    UPLOAD_FAILED = "upload_failed"
    UPLOAD_DROPPED = "upload_dropped"
