"""The remote tier: leaves other nodes published, used only once they verify against
THIS node's files (DESIGN.md §11).

A remote leaf is used only after: a strict decode of its manifest; tenant, backend,
build key and deps key matching; its signature (when keys are configured); its size
within the limit — only then is its artifact asked for (a small one, the build key's
head, came in the same round trip as the index, unread) — then its closure rehashed
against the local files (``leaf.verify_closure``, while the bytes travel) and its
negatives absent here — only then are the bytes read, their BLAKE3 checked, and loaded
from those bytes (on a closure miss they are dropped unread). Every failure is a miss
with a reason (:class:`~safejit.outcomes.Miss`); nothing from the remote ever raises
out of a tier call. Uploads happen after a clean local publish (``uploads.py``).
Leases make one node of a fleet compile a key while the others watch its index; they
save work and decide nothing (write-once keys, content addressing and local
verification decide).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Final

from ... import _clock
from ...closure.anchors import Anchors
from ...closure.hashing import digest_bytes
from ...keys import deps_key as compute_deps_key
from ...outcomes import Miss, Tier
from ...telemetry import ATTR, SPAN, instruments, mark_failed, span
from ..leaf import (
    ClosureMemo,
    Manifest,
    ManifestError,
    Rejection,
    VerifiedLeaf,
    Verifier,
    check_signature,
    decode_manifest,
    verify_closure,
)
from .layout import split_entry
from .lease import LeaseKeeper
from .store import Lease, PendingBlob, RemoteError, RemoteStore
from .uploads import UploadQueue

__all__ = ["MISS_OF", "RemoteTier"]

logger = logging.getLogger(__name__)

#: What a remote failure's reason is as a miss.
MISS_OF: Final[Mapping[str, Miss]] = {
    "timeout": Miss.REMOTE_TIMEOUT,
    "refused": Miss.REMOTE_REFUSED,
    "denied": Miss.REMOTE_DENIED,
    "oversize": Miss.OVERSIZE,
    "corrupt": Miss.ARTIFACT,
    "unwritable": Miss.REMOTE_UNWRITABLE,
    "error": Miss.REMOTE_ERROR,
    "circuit_open": Miss.CIRCUIT_OPEN,
}


#: Misses that are the remote failing (its lookup span is marked failed), not its answer.
_REMOTE_FAILED: Final = frozenset({Miss.REMOTE_TIMEOUT, Miss.REMOTE_REFUSED, Miss.REMOTE_DENIED, Miss.REMOTE_ERROR})


def _whole(view: memoryview) -> bytes:
    """The bytes ``view`` shows: the object it views when it shows all of it (a raw artifact
    read on its own, a decompressed one), else a copy."""
    whole = view.obj
    if isinstance(whole, bytes) and view.c_contiguous and view.nbytes == len(whole):
        return whole
    return bytes(view)


_told: set[str] = set()


def _unexpected(what: str, build_key: str) -> None:
    """Log a lease command's unexpected failure: with its traceback the first time (per
    kind, per process), after that at DEBUG (a lease wait asks every few ms)."""
    first = what not in _told
    _told.add(what)
    logger.log(logging.ERROR if first else logging.DEBUG, what, build_key[:16], exc_info=True)


def _cancel(pending: PendingBlob | RemoteError | None) -> None:
    if pending is not None and not isinstance(pending, RemoteError):
        pending.cancel()


class RemoteTier:
    """One remote namespace (a tenant's and backend's) as a cache tier. ``writable``:
    this node may publish and take leases (``remote_mode="read-write"``)."""

    tier: Final = Tier.REMOTE

    def __init__(
        self,
        store: RemoteStore,
        *,
        writable: bool,
        verifier: Verifier | None,
        memo: ClosureMemo | None,
        max_artifact_bytes: int,
        attrs: Mapping[str, str],
    ) -> None:
        self.store = store
        self.writable = writable
        self._verifier = verifier
        self._memo = memo
        self._max_bytes = min(max_artifact_bytes, store.settings.max_bytes)
        self._attrs = {**attrs, ATTR.REMOTE_ENGINE: store.engine}
        self._node = f"{socket.gethostname()}:{os.getpid()}"
        #: The uploads this node offers (``uploads.py``).
        self.uploads = UploadQueue(store, self._attrs)

    # -- lookup ------------------------------------------------------------------
    def lookup(self, build_key: str, anchors: Anchors, *, counted: bool = True) -> VerifiedLeaf | Rejection:
        """The newest leaf of ``build_key`` on the remote that verifies here, else the
        first reason one did not (``absent``: none there). One round trip on a miss.
        Not ``counted``: the caller counts the request's outcome (:meth:`count`) once it
        is known (a leaf may still come through the lease)."""
        with span(SPAN.REMOTE_LOOKUP, {ATTR.TIER: Tier.REMOTE, ATTR.BUILD_KEY: build_key, **self._attrs}) as s:
            found = self._lookup(build_key, anchors)
            if isinstance(found, VerifiedLeaf):
                s.set_attributes({ATTR.RESULT: "hit", ATTR.BYTES: len(found.artifact)})
            else:
                s.set_attributes({ATTR.RESULT: "miss", ATTR.REASON: found.reason})
                if found.reason in _REMOTE_FAILED:  # (the remote failed, not just had nothing)
                    mark_failed(s, RemoteError.__name__, found.detail)
        if counted:
            self.count(found)
        return found

    def count(self, found: VerifiedLeaf | Rejection) -> None:
        """Count one request's remote outcome (``safejit.cache.lookups``)."""
        if isinstance(found, VerifiedLeaf):
            instruments.lookup(Tier.REMOTE, "hit", "verified", self._attrs)
        else:
            instruments.lookup(Tier.REMOTE, "miss", found.reason, self._attrs)

    def _lookup(self, build_key: str, anchors: Anchors) -> VerifiedLeaf | Rejection:
        try:
            return self._look(build_key, anchors)
        except Exception as exc:  # (whatever the remote's data makes a check raise is a miss, never raised)
            logger.exception("checking the remote's leaves of %s failed", build_key)
            return Rejection(Miss.REMOTE_ERROR, f"{type(exc).__name__}: {exc}", root="remote")

    def _look(self, build_key: str, anchors: Anchors) -> VerifiedLeaf | Rejection:
        try:
            index, head = self.store.index_and_head(build_key)
        except RemoteError as exc:
            return Rejection(MISS_OF[exc.reason], str(exc), root="remote")
        given: PendingBlob | None = None
        try:
            first: Rejection | None = None
            entries = []
            for entry, raw in index.items():
                try:
                    man = decode_manifest(raw)
                except ManifestError as exc:
                    first = first or Rejection(Miss.MANIFEST, str(exc), entry, "remote")
                    continue
                entries.append((man.created, entry, man))
            for _, entry, man in sorted(entries, key=lambda e: e[0], reverse=True):
                # (the head, read or not, goes with the newest leaf: the one a hit most likely is)
                given, head = head, None
                result = self._verify(build_key, entry, man, anchors, given)
                if isinstance(result, VerifiedLeaf):
                    return result
                first = first or result
            return first or Rejection(Miss.ABSENT, root="remote")
        finally:
            # (the head not given yet; or given, where the check raised before it was read or
            # cancelled: a cancel after either is nothing)
            _cancel(head)
            _cancel(given)

    def _verify(
        self, build_key: str, entry: str, man: Manifest, anchors: Anchors, head: PendingBlob | None = None
    ) -> VerifiedLeaf | Rejection:
        """The leaf stored as index entry ``entry`` (``layout.entry_name``), if it verifies
        here. ``head``: the build key's head, asked for with the index (cancelled or read
        here): the artifact when its bytes are this leaf's, else fetched by digest after all."""
        leaf = f"remote:{build_key}/deps-{entry}"
        checked = _clock.now()
        bad = self._vouch(build_key, entry, man, leaf)
        if bad is not None or (head is not None and man.artifact_size > self.store.settings.head_max_bytes):
            _cancel(head)
            head = None
            if bad is not None:
                return bad
        # What the manifest alone vouches for (its signature, its size) is enough to ask
        # for the artifact: its bytes travel while the closure is checked here, and are
        # read only once it holds; on a miss they are dropped unread, never decoded,
        # hashed, kept or loaded. The head's are on their way already.
        pending = head if head is not None else self._start_fetch(man)
        try:
            closure = verify_closure(man, anchors, leaf, self._memo)
        except BaseException:
            _cancel(pending)
            raise
        if isinstance(closure, Rejection):
            _cancel(pending)
            return Rejection(closure.reason, closure.detail, leaf, "remote")
        artifact = self._finish_fetch(pending, man, leaf, want=man.artifact_digest if head is not None else None)
        if isinstance(artifact, Rejection) and head is not None:
            # (no head, another leaf's, or one that did not read or decode: the blob it names)
            logger.debug("the head of %s did not serve: %s", build_key[:16], artifact.detail)
            artifact = self._fetch(man, leaf)
        if isinstance(artifact, Rejection):
            return artifact
        states, negatives = closure
        return VerifiedLeaf("", "remote", man, artifact, states, negatives, checked=checked)

    def _vouch(self, build_key: str, entry: str, man: Manifest, leaf: str) -> Rejection | None:
        """What can be checked of a manifest without files: it names the leaf it is
        stored as (its deps key, and its signer's key id, make the entry's name), its
        dependencies reproduce its deps key, its signature, its size."""
        signer = man.signature.key_id if man.signature is not None else ""
        # (a signed manifest under its bare deps key: as writers before key ids in entry
        # names stored it; its signature is checked all the same)
        if (
            man.build_key != build_key
            or split_entry(entry) not in ((man.deps_key, signer), (man.deps_key, ""))
            or man.tenant != self.store.tenant
            or man.backend != self.store.backend
        ):
            return Rejection(Miss.MISMATCH, "the manifest names another leaf", leaf, "remote")
        if compute_deps_key(man.deps, man.negatives) != man.deps_key:
            return Rejection(Miss.MISMATCH, "the listed dependencies do not reproduce the leaf name", leaf, "remote")
        bad = check_signature(man, self._verifier)
        if bad is not None:
            return Rejection(bad.reason, bad.detail, leaf, "remote")
        if man.artifact_size > self._max_bytes:
            return Rejection(Miss.OVERSIZE, f"{man.artifact_size} bytes", leaf, "remote")
        return None

    def _fetch(self, man: Manifest, leaf: str) -> bytes | Rejection:
        """The artifact's bytes, fetched within the manifest's size, if they hash as it says."""
        return self._finish_fetch(self._start_fetch(man), man, leaf)

    def _start_fetch(self, man: Manifest) -> PendingBlob | RemoteError:
        try:
            return self.store.start_blob(man.artifact_digest, size=man.artifact_size)
        except RemoteError as exc:
            return exc  # reported only if the closure holds: a closure miss is the better reason

    def _finish_fetch(
        self, pending: PendingBlob | RemoteError, man: Manifest, leaf: str, *, want: str | None = None
    ) -> bytes | Rejection:
        with span(SPAN.REMOTE_FETCH, {ATTR.BYTES: man.artifact_size, **self._attrs}):
            try:
                if isinstance(pending, RemoteError):
                    raise pending
                view = pending.result(want=want)
            except RemoteError as exc:
                return Rejection(MISS_OF[exc.reason], str(exc), leaf, "remote")
        if view is None:
            return Rejection(Miss.ARTIFACT, "the artifact is not on the remote", leaf, "remote")
        # (hashed as the bytes arrived, while the rest of them was on its way, where the engine could)
        digest = pending.digest or digest_bytes(view)
        if len(view) != man.artifact_size or digest != man.artifact_digest:
            return Rejection(Miss.ARTIFACT, "the artifact's bytes do not match the manifest", leaf, "remote")
        return _whole(view)

    def audit(self, build_key: str, entry: str, raw: bytes, anchors: Anchors | None = None) -> Rejection | None:
        """Why the manifest ``raw`` stored as index entry ``entry`` of ``build_key`` would
        not be used, or None (``safejit remote verify``): the checks of a lookup, in its
        order — strict decode, names, deps key, signature, size, then (with ``anchors``)
        the closure against this machine's files, then the artifact's bytes. Reads only."""
        leaf = f"remote:{build_key}/deps-{entry}"
        try:
            man = decode_manifest(raw)
        except ManifestError as exc:
            return Rejection(Miss.MANIFEST, str(exc), leaf, "remote")
        if anchors is not None:
            found = self._verify(build_key, entry, man, anchors)
            return None if isinstance(found, VerifiedLeaf) else found
        bad = self._vouch(build_key, entry, man, leaf)
        if bad is not None:
            return bad
        fetched = self._fetch(man, leaf)
        return fetched if isinstance(fetched, Rejection) else None

    # -- leases ------------------------------------------------------------------
    def take_lease(self, build_key: str) -> Lease | None:
        """The build key's lease for this node, if nobody holds it (and this node may
        publish); None otherwise, and when the remote cannot be asked."""
        got = self._take(build_key)
        return None if isinstance(got, RemoteError) else got

    def _take(self, build_key: str) -> Lease | RemoteError | None:
        """:meth:`take_lease`, telling a remote that refused (full, down: the error) from
        a lease another node holds (None)."""
        if not self.writable:
            return None
        try:
            return self.store.acquire_lease(build_key, holder=self._node)
        except RemoteError as exc:
            logger.debug("lease on %s not taken: %s", build_key[:16], exc)
            return exc
        except Exception as exc:  # (whatever else a lease command raises is the remote failing, never raised)
            _unexpected("taking the lease on %s failed", build_key)
            return RemoteError("error", "lease", f"{type(exc).__name__}: {exc}", engine=self.store.engine)

    def _held(self, build_key: str) -> bool | None:
        """Whether a node holds the build key's lease; None when the remote cannot say."""
        try:
            return self.store.lease_holder(build_key) is not None
        except RemoteError:
            return None
        except Exception:  # (as in _take)
            _unexpected("asking who holds the lease on %s failed", build_key)
            return None

    def claim(self, build_key: str, anchors: Anchors, *, deadline: float) -> VerifiedLeaf | Lease | None:
        """This node's turn to compile ``build_key`` (the lease), or the leaf another
        node published while this one asked; None: compile without a lease (the remote
        cannot be asked, or the wait ran to ``deadline``). A lease held elsewhere is
        waited on (``wait``). One let go between this node's try and its look (the
        holder just published) is looked for again, never taken for a free one."""
        lease = self.take_lease(build_key)
        if lease is not None:
            return lease
        held = self._held(build_key)
        if held:
            return self.wait(build_key, anchors, deadline=deadline, take=lambda: self._take(build_key))
        if held is None or not self.writable:
            return None
        found = self._lookup(build_key, anchors)
        return found if isinstance(found, VerifiedLeaf) else self.take_lease(build_key)

    def keep(self, lease: Lease) -> LeaseKeeper:
        """A heartbeat that keeps ``lease`` while this node compiles (started)."""
        return LeaseKeeper(self.store, lease).start()

    def wait(
        self, build_key: str, anchors: Anchors, *, deadline: float, take: Callable[[], Lease | RemoteError | None]
    ) -> VerifiedLeaf | Lease | None:
        """While another node holds the build key's lease, watch its index: the leaf it
        publishes (verified), or the lease once its holder let it go or died (``take``
        tries for it: exactly one waiter gets it; its error: the remote refused it); None
        at ``deadline``, when the lease went away with nothing published and another waiter
        took it, or when the free lease could not be taken (a full server: compile now)."""
        pause = 0.005
        with span(SPAN.REMOTE_LEASE_WAIT, {ATTR.BUILD_KEY: build_key, **self._attrs}) as s:
            while time.monotonic() < deadline:
                # Whether it is held, then the index: a holder publishes before it lets go,
                # so a lease seen free here and nothing in the index after means nothing
                # was published. (The other order took a leaf published between the look
                # and the ask for a dead holder's, and compiled it again.)
                held = self._held(build_key)
                if held is None:  # (the remote went away: this node compiles)
                    s.set_attribute(ATTR.RESULT, "unavailable")
                    return None
                found = self._lookup(build_key, anchors)
                if isinstance(found, VerifiedLeaf):
                    s.set_attribute(ATTR.RESULT, "published")
                    return found
                if not held:
                    if not self.writable:  # (it takes no lease: nothing more will come of waiting)
                        s.set_attribute(ATTR.RESULT, "let go")
                        return None
                    lease = take()
                    if isinstance(lease, RemoteError) and lease.reason in ("unwritable", "denied"):
                        s.set_attribute(ATTR.RESULT, "unavailable")  # (free, and not to be had: a full server)
                        return None
                    if isinstance(lease, RemoteError):  # (a moment's failure: the next look says more)
                        lease = None
                    if lease is not None:
                        s.set_attribute(ATTR.RESULT, "taken over")
                        return lease
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            s.set_attribute(ATTR.RESULT, "timeout")
        return None

    # -- uploads -----------------------------------------------------------------
    def offer(
        self, build_key: str, leaf: VerifiedLeaf, keeper: LeaseKeeper | None, *, unless_present: bool = False
    ) -> None:
        """Upload a clean, locally published ``leaf`` in the background (``UploadQueue.offer``);
        nothing on a read-only node, where ``keeper``, if any, is stopped now."""
        if self.writable:
            self.uploads.offer(build_key, leaf, keeper, unless_present=unless_present)
        elif keeper is not None:
            keeper.stop()

    def close(self, timeout: float = 5.0) -> None:
        """Let the queued uploads go (``UploadQueue.close``), then close the store."""
        self.uploads.close(timeout)
        self.store.close()
