"""The remote tier's uploads: clean, locally published leaves copied to the remote in
the background, on a bounded queue worked by one thread (what does not fit is dropped
and counted), each with the heartbeat that keeps its build's lease until it is there.
What became of each is kept for ``Runtime.flush_uploads``.

>>> uploads = UploadQueue(store, attrs={})                                     # doctest: +SKIP
>>> uploads.offer(build_key, leaf, keeper)                                    # doctest: +SKIP
>>> uploads.drain(10).results[0].outcome                                      # doctest: +SKIP
<Outcome.UPLOADED: 'uploaded'>
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ...outcomes import Outcome
from ...telemetry import ATTR, SPAN, instruments, mark_failed, span
from ..leaf import ManifestError, VerifiedLeaf, decode_manifest, encode_manifest
from .layout import entry_name
from .lease import LeaseKeeper
from .store import Put, RemoteError, RemoteStore

__all__ = [
    "INDEX_FULL",
    "PRESENT",
    "UNSIGNED",
    "UPLOAD_QUEUE",
    "UPLOAD_QUEUE_BYTES",
    "Upload",
    "UploadQueue",
    "UploadResult",
    "Uploads",
]

logger = logging.getLogger(__name__)

#: Upload failures logged at INFO: the remote away a moment, or not asked; the others (a
#: denied user, a missing bucket, a full server) at WARNING.
_TRANSIENT: Final = frozenset({"timeout", "refused", "circuit_open"})

#: How long an upload waits before it starts (see ``_work``).
_UPLOAD_GRACE_S = 0.002
#: How long the worker waits for an upload before it ends (the next offer starts one): a
#: node dropped without ``close()`` keeps no thread, nor the store's connections it holds.
_IDLE_S = 5.0

#: Leaves waiting to be uploaded, at most (a burst of compiles beyond it drops uploads).
UPLOAD_QUEUE: Final = 32
#: ... and at most this many artifact bytes (held in memory until sent); one upload of
#: any size is always taken when none is queued.
UPLOAD_QUEUE_BYTES: Final = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Upload:
    """A clean, locally published leaf to copy to the remote, and the heartbeat that
    keeps the build's lease until it is there (stopped then: the lease is let go and the
    fleet's waiters find the index entry; a lease let lapse before would let one of them
    compile the key again)."""

    build_key: str
    leaf: VerifiedLeaf
    keeper: LeaseKeeper | None
    #: Skip it when the remote's index holds the leaf already (a disk hit offered by warm).
    unless_present: bool = False


#: An :class:`UploadResult`'s ``detail`` when the leaf was on the remote already.
PRESENT: Final = "already on the remote"
#: ... when the build key's index holds ``index_cap`` leaves.
INDEX_FULL: Final = "the build key's index is full"
#: ... when the leaf is not signed (made before this node had a key): no node would use it.
UNSIGNED: Final = "the leaf is not signed"


@dataclass(frozen=True, slots=True)
class UploadResult:
    """What became of one offered upload: ``outcome`` is ``uploaded`` (``detail``
    :data:`PRESENT` when another writer's copy was there first), ``upload_skipped``
    (``detail``: :data:`PRESENT`, :data:`INDEX_FULL` or :data:`UNSIGNED`), ``upload_failed`` (``reason``: the
    remote's, from ``REASONS``; ``detail``: its error, redacted) or ``upload_dropped``
    (the queue was full)."""

    build_key: str
    deps_key: str
    outcome: Outcome
    detail: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Uploads:
    """:meth:`RemoteTier.drain`'s answer: the uploads finished since it was last asked,
    and whether none is still queued (``done``)."""

    done: bool
    results: tuple[UploadResult, ...]


#: Finished uploads remembered for :meth:`RemoteTier.drain` (the oldest are forgotten).
RESULTS_KEPT: Final = 4 * UPLOAD_QUEUE


class UploadQueue:
    """Uploads to ``store``, one at a time, off the compiles that offered them."""

    def __init__(self, store: RemoteStore, attrs: Mapping[str, str]) -> None:
        self.store = store
        self._attrs = dict(attrs)
        self._uploads: queue.Queue[Upload | None] = queue.Queue(maxsize=UPLOAD_QUEUE)
        self._worker: threading.Thread | None = None
        # (offer and close: nothing is queued once closed, so no upload can be left behind
        # the worker's stop with its lease renewed for as long as the process lives)
        self._lock = threading.Lock()
        self._closed = False
        self.dropped = 0
        self.uploaded = 0
        #: Bytes of artifacts queued, not yet sent (held in memory meanwhile).
        self._queued_bytes = 0
        self._results: collections.deque[UploadResult] = collections.deque(maxlen=RESULTS_KEPT)

    def offer(
        self, build_key: str, leaf: VerifiedLeaf, keeper: LeaseKeeper | None, *, unless_present: bool = False
    ) -> None:
        """Upload a clean, locally published ``leaf`` in the background; ``keeper``, if
        any, goes on renewing the build's lease until the leaf is there, and is stopped
        then (letting the lease go). A full queue drops it: counted, and the lease let
        go now. ``unless_present``: look at the index first, and send nothing when the
        leaf is there (``safejit warm --remote`` offers its disk hits so)."""
        item = Upload(build_key, leaf, keeper, unless_present)
        with self._lock:
            why = self._enqueue(item)
        if why:
            self._drop(item, why)

    def _enqueue(self, item: Upload) -> str:
        """Queue ``item`` for the worker (started if need be); why not, else ""."""
        if self._closed:
            return "the node was closed"
        if self._worker is None or not self._worker.is_alive():
            worker = threading.Thread(target=self._work, name="safejit-upload", daemon=True)
            try:
                worker.start()
            except RuntimeError as exc:  # (no new thread: the interpreter is shutting down)
                return f"no upload worker could start: {exc}"
            self._worker = worker
        size = len(item.leaf.artifact)
        if self._queued_bytes and self._queued_bytes + size > UPLOAD_QUEUE_BYTES:
            return f"the upload queue held {self._queued_bytes} bytes"
        try:
            self._uploads.put_nowait(item)
        except queue.Full:
            return "the upload queue was full"
        self._queued_bytes += size
        return ""

    def _drop(self, item: Upload, why: str) -> None:
        """Count ``item`` as dropped and let its lease go now."""
        self.dropped += 1
        self._done(item, Outcome.UPLOAD_DROPPED, why)
        if item.keeper is not None:
            item.keeper.stop()

    def _done(self, item: Upload, outcome: Outcome, detail: str = "", reason: str = "") -> None:
        self._results.append(UploadResult(item.build_key, item.leaf.manifest.deps_key, outcome, detail, reason))
        instruments.remote_uploads.add(1, {**self._attrs, ATTR.OUTCOME: outcome})

    def drain(self, timeout: float = 10.0) -> Uploads:
        """Wait (at most ``timeout`` seconds) for the queued uploads, then hand over what
        became of those finished since the last call."""
        done = self.flush(timeout)
        results = []
        with contextlib.suppress(IndexError):
            while True:
                results.append(self._results.popleft())
        return Uploads(done, tuple(results))

    def _work(self) -> None:
        while True:
            try:
                item = self._uploads.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._lock:  # (what is offered meanwhile, under this lock, starts a worker of its own)
                    if self._uploads.empty():
                        self._worker = None
                        return
                continue
            try:
                if item is None:
                    return
                # The compile that offered it still has its kernel to hand back: an upload
                # started now would take the GIL from it (+0.3-0.6 ms measured); uploads
                # are asynchronous, 2 ms later is as good.
                time.sleep(_UPLOAD_GRACE_S)
                self._upload(item)
            finally:
                if item is not None:
                    with self._lock:
                        self._queued_bytes -= len(item.leaf.artifact)
                self._uploads.task_done()

    def _upload(self, item: Upload) -> None:
        man = item.leaf.manifest
        outcome, detail, reason, error_type = Outcome.UPLOADED, "", "", ""
        attrs = {ATTR.BUILD_KEY: item.build_key, ATTR.BYTES: man.artifact_size, **self._attrs}
        with span(SPAN.REMOTE_PUBLISH, attrs) as s:
            try:
                signer = man.signature.key_id if man.signature is not None else ""
                if man.signature is None:  # (a remote leaf is used only when signed)
                    outcome, detail = Outcome.UPLOAD_SKIPPED, UNSIGNED
                elif item.unless_present and self._present(item.build_key, man.deps_key, signer):
                    outcome, detail = Outcome.UPLOAD_SKIPPED, PRESENT
                else:
                    # The artifact first: an index entry is never there before what it names.
                    self.store.put_blob(man.artifact_digest, item.leaf.artifact)
                    if len(item.leaf.artifact) <= self.store.settings.head_max_bytes:
                        # (write-once: the build key's first leaf's, read with the index; one
                        # not stored costs a lookup a round trip, never the leaf its entry)
                        try:
                            self.store.put_head(item.build_key, man.artifact_digest, item.leaf.artifact)
                        except RemoteError as exc:
                            logger.debug("the head of %s was not stored: %s", item.build_key[:16], exc)
                    put = self._publish(item.build_key, man.deps_key, signer, encode_manifest(man))
                    if put is Put.FULL:
                        outcome, detail = Outcome.UPLOAD_SKIPPED, INDEX_FULL
                    elif put is Put.EXISTS:
                        detail = PRESENT
            except RemoteError as exc:
                # (what will fail again until someone acts, loud; a moment's failure, quiet)
                level = logging.INFO if exc.reason in _TRANSIENT else logging.WARNING
                logger.log(level, "uploading %s failed: %s", man.name, exc)
                outcome, detail, reason = Outcome.UPLOAD_FAILED, str(exc), exc.reason
                error_type = type(exc).__name__
            except Exception as exc:  # (never the worker's end: every upload gets its outcome)
                logger.exception("uploading %s failed", man.name)
                outcome, detail, reason = Outcome.UPLOAD_FAILED, type(exc).__name__, "error"
                error_type = type(exc).__name__
            finally:
                if item.keeper is not None:
                    item.keeper.stop()
            s.set_attribute(ATTR.OUTCOME, outcome)
            if outcome is Outcome.UPLOAD_FAILED:
                mark_failed(s, error_type, detail)
        if outcome is Outcome.UPLOADED:
            self.uploaded += 1
        self._done(item, outcome, detail, reason)

    def _present(self, build_key: str, deps_key: str, signer: str) -> bool:
        """Whether the index holds this leaf as ``signer`` signed it."""
        index = self.store.index(build_key)
        return entry_name(deps_key, signer) in index or _signed_by(index.get(deps_key), signer)

    def _publish(self, build_key: str, deps_key: str, signer: str, manifest: bytes) -> Put:
        """Publish under the bare deps key, which every reader reads (those from before
        key ids in entry names too); where another signer's manifest holds it (the key was
        rotated), under ``<D>.<key id>``: readers holding only this key's public half
        use that one."""
        put = self.store.publish_manifest(build_key, deps_key, manifest)
        if put is not Put.EXISTS or not signer or _signed_by(self.store.index(build_key).get(deps_key), signer):
            return put
        return self.store.publish_manifest(build_key, entry_name(deps_key, signer), manifest)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait (at most ``timeout`` seconds) for the queued uploads; whether all are done."""
        deadline = time.monotonic() + timeout
        while self._uploads.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._uploads.unfinished_tasks

    def close(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` seconds) for the queued uploads. Those still queued
        then are dropped (counted) and their leases let go now: another node compiles
        the key at once, not after the lease's TTL; so is what is offered after.
        (The store is the caller's to close.) A second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.flush(timeout)
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._uploads.get_nowait()
                try:
                    if item is not None:
                        self._drop(item, "closed before it was sent")
                finally:
                    self._uploads.task_done()
        with self._lock:
            worker = self._worker
            if worker is not None and worker.is_alive():
                # (nothing is queued after close: the stop is the last item the worker reads)
                self._uploads.put_nowait(None)


def _signed_by(manifest: bytes | None, signer: str) -> bool:
    """Whether ``manifest`` (an index entry's bytes, unverified) says ``signer`` signed it."""
    if manifest is None:
        return False
    try:
        man = decode_manifest(manifest)
    except ManifestError:
        return False
    return (man.signature.key_id if man.signature is not None else "") == signer
