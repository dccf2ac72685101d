"""The disk tier: layout, self-verifying leaves, lookup and the publish protocol.

Layout under each root (DESIGN.md §5)::

    <root>/v1/tmp/<uuid>/                       staging and compile work dirs
    <root>/v1/locks/<build_key>.lock
    <root>/v1/quarantine/<uuid>/                leaves that failed verification
    <root>/v1/<tenant>/<backend>/<K[:2]>/build-<K>/deps-<D>/
          artifact.<ext>   manifest.json   .committed

A leaf is a hit only if ``.committed`` holds the digest of ``manifest.json``,
the manifest parses under the strict schema and names this leaf, its deps
rehashed *now* reproduce ``<D>``, the artifact bytes match the manifest and
(when a key is configured) the signature verifies. Readers take no lock.

Layout, lookup and publish stay in one module on purpose (~560 lines): they are
one protocol (DESIGN.md §5), and each half is checked against the other; what
is not part of it lives beside it. Work
directories prepared ahead are in ``spares.py``, file primitives in ``fsio.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import stat
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from .. import faults
from ..closure.anchors import LINK_ANCHOR, Anchors, is_under
from ..closure.hashing import Snapshot, digest_bytes, hash_opened, snapshot_of
from ..keys import deps_key as compute_deps_key
from ..telemetry import ATTR, SPAN, instruments, span
from .fsio import (
    EarlyWrite,
    Flock,
    fsync_dir,
    fsync_file,
    lock_file,
    makedirs_durable,
    read_bytes,
    remove_tree,
    rename,
    write_file,
)
from .leaf import Manifest, ManifestError, parse_manifest
from .staging import LOCK_BLANK, Spares, Workdir, background, make, memory_scratch, remove_quietly, with_scratch
from .statmemo import StatMemo

__all__ = ["LAYOUT", "DepState", "DiskCache", "Rejection", "Signer", "VerifiedLeaf"]

logger = logging.getLogger(__name__)

LAYOUT: Final = "v1"
MARKER: Final = ".committed"
#: The fault point passed just before a leaf's marker is written into its stage (each
#: time: a leaf staged early and then written again by the publish passes it twice).
BEFORE_COMMIT: Final = "publish.before_commit"
MANIFEST: Final = "manifest.json"
_MANIFEST_LIMIT: Final = 64 << 20
#: Reasons that mean the leaf itself is damaged (quarantined), not merely outdated.
CORRUPT_REASONS: Final = frozenset({"marker", "manifest", "mismatch", "artifact"})

DepState = tuple[str, Snapshot, str]  # absolute path, stat snapshot, digest


class Signer(Protocol):
    def sign(self, message: bytes) -> str: ...
    def verify(self, message: bytes, signature: str) -> bool: ...


class Rejection(NamedTuple):
    root: str
    leaf: str
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class VerifiedLeaf:
    path: str
    root: str
    manifest: Manifest
    artifact: bytes
    dep_states: tuple[DepState, ...] = field(repr=False)
    #: Paths that must stay absent (shadowing headers, false ``__has_include``).
    negatives: tuple[str, ...] = field(default=(), repr=False)
    #: False when the compiler's dependency scan was incomplete (never cached beyond one use).
    closure_known: bool = True


class DiskCache:
    """Lookup and publish over an ordered list of roots (first writable wins)."""

    def __init__(
        self,
        roots: Sequence[str],
        *,
        tenant: str,
        backend: str,
        signer: Signer | None = None,
        require_signed: bool = False,
        max_artifact_bytes: int = 512 << 20,
        max_leaves: int = 64,
        stat_memo: StatMemo | None = None,
    ) -> None:
        self.roots = tuple(os.path.realpath(os.path.expanduser(r)) for r in roots)
        self.tenant = tenant
        self.backend = backend
        self.signer = signer
        self.require_signed = require_signed
        self.max_artifact_bytes = max_artifact_bytes
        self.max_leaves = max_leaves
        self.stat_memo = stat_memo
        #: Work directories prepared ahead (set by the runtime, which knows the artifact's name).
        self.spares: Spares | None = None
        #: Compile in a private directory on /dev/shm (Config.scratch == "memory").
        self.memory_scratch = False
        self._attrs = {ATTR.BACKEND: backend, ATTR.TENANT: tenant}
        self._writable: str | None = None
        self._root_ids: dict[str, tuple[int, int]] = {}
        self._leaf_memo: tuple[Manifest, str, Manifest, bytes] | None = None
        self.last_error: OSError | None = None

    # -- layout --------------------------------------------------------------
    def build_dir(self, root: str, build_key: str) -> str:
        return os.path.join(root, LAYOUT, self.tenant, self.backend, build_key[:2], f"build-{build_key}")

    def writable_root(self) -> str | None:
        """The first root that can take new entries. A success is remembered; a
        failure is not (a full or flaky disk may recover), and its error is kept
        in ``last_error`` for the caller to report. A root whose directory was
        swapped (for a symlink, or another directory) since it was first used is
        unusable: nothing is written through it."""
        if isinstance(self._writable, str):
            if self._same_root(self._writable):
                return self._writable
            self._writable = None
        for root in self.roots:
            try:
                st = os.lstat(root)
                if stat.S_ISLNK(st.st_mode) or (root in self._root_ids and not self._same_root(root)):
                    raise OSError(errno.EXDEV, "cache root was replaced since it was first used", root)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.last_error = exc
                continue
            try:
                makedirs_durable(os.path.join(root, LAYOUT, "tmp"))
                makedirs_durable(os.path.join(root, LAYOUT, "locks"))
                st = os.lstat(root)
            except OSError as exc:
                self.last_error = exc
                continue
            if os.access(os.path.join(root, LAYOUT, "tmp"), os.W_OK | os.X_OK):
                self._root_ids.setdefault(root, (st.st_dev, st.st_ino))
                self._writable = root
                return root
            self.last_error = PermissionError(errno.EACCES, "cache root is not writable", root)
        return None

    def _same_root(self, root: str) -> bool:
        try:
            st = os.lstat(root)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and self._root_ids.get(root) == (st.st_dev, st.st_ino)

    def new_workdir(self, root: str) -> str:
        path = os.path.join(root, LAYOUT, "tmp", uuid.uuid4().hex)
        os.mkdir(path, 0o700)
        return path

    def workdir(self, root: str) -> Workdir:
        """A work directory for one compile and its publish, prepared ahead when possible,
        with its scratch in memory when ``memory_scratch`` is set."""
        base = os.path.join(root, LAYOUT, "tmp")
        wd = self.spares.take(base) if self.spares is not None else make(base, "", prepared=False)
        try:
            return with_scratch(wd, memory_scratch() if self.memory_scratch else None)
        except OSError as exc:
            logger.debug("no scratch in memory (%s); compiling in the cache root", exc)
            return wd

    def discard_workdir_later(self, wd: Workdir, root: str) -> None:
        """Delete a work directory (and its scratch) in the background; ``gc`` (and, for
        memory scratch, the next process) removes what a dead process left."""
        self.discard_later(wd.path, root)
        if wd.scratch != wd.path:
            background().submit(remove_quietly, wd.scratch)

    def discard(self, path: str, root: str) -> None:
        with contextlib.suppress(OSError):
            remove_tree(path, within=os.path.join(root, LAYOUT))

    def discard_later(self, path: str, root: str) -> None:
        """Delete a work directory in the background (``gc`` removes it if the process dies first)."""
        background().submit(self.discard, path, root)

    def refill_later(self, root: str) -> None:
        """Prepare the next work directory in the background."""
        if self.spares is not None:
            self.spares.refill(os.path.join(root, LAYOUT, "tmp"))

    def make_build_dir_later(self, root: str, build_key: str) -> None:
        """Create ``build-<K>`` in the background while the compiler runs (publish makes
        sure of it again; an empty build dir is a plain miss)."""
        background().submit(_makedirs_quiet, self.build_dir(root, build_key))

    # -- lookup --------------------------------------------------------------
    def candidates(self, root: str, build_key: str) -> list[str]:
        """Leaves under ``build-<K>`` in one root, newest first."""
        bdir = self.build_dir(root, build_key)
        entries = []
        try:
            with os.scandir(bdir) as it:
                for e in it:
                    if e.name.startswith("deps-") and e.is_dir(follow_symlinks=False):
                        with contextlib.suppress(OSError):  # pruned meanwhile: not a candidate
                            entries.append((e.stat(follow_symlinks=False).st_mtime_ns, e.path))
        except OSError:
            return []
        entries.sort(reverse=True)
        return [path for _, path in entries[: self.max_leaves]]

    def lookup_root(
        self, root: str, build_key: str, anchors: Anchors, rejections: list[Rejection]
    ) -> VerifiedLeaf | None:
        memo: dict[str, tuple[str, Snapshot] | None] = {}
        for leaf in self.candidates(root, build_key):
            with span(SPAN.VERIFY, {ATTR.ROOT: root, "safejit.leaf": os.path.basename(leaf)}) as s:
                started = time.perf_counter()
                result = self.verify(leaf, root, build_key, anchors, memo)
                instruments.verify_duration.record(time.perf_counter() - started, self._attrs)
                if isinstance(result, VerifiedLeaf):
                    s.set_attributes({ATTR.RESULT: "ok", ATTR.DEPS_COUNT: len(result.manifest.deps)})
                else:
                    s.set_attributes({ATTR.RESULT: "rejected", ATTR.REASON: result.reason})
            if isinstance(result, VerifiedLeaf):
                with contextlib.suppress(OSError):
                    os.utime(leaf)  # best effort: read-only roots still hit
                return result
            rejections.append(result)
            if result.reason in CORRUPT_REASONS and root == self.writable_root():
                self.quarantine(leaf, root)
        return None

    def lookup(
        self, build_key: str, anchors: Anchors, rejections: list[Rejection] | None = None
    ) -> VerifiedLeaf | None:
        sink: list[Rejection] = [] if rejections is None else rejections
        for root in self.roots:
            leaf = self.lookup_root(root, build_key, anchors, sink)
            if leaf is not None:
                return leaf
        return None

    def verify(
        self,
        leaf: str,
        root: str,
        build_key: str,
        anchors: Anchors | None,
        memo: dict[str, tuple[str, Snapshot] | None] | None = None,
    ) -> VerifiedLeaf | Rejection:
        """Check a leaf completely; a :class:`Rejection` says why it is not a hit.

        With ``anchors=None`` only the leaf's own integrity is checked (marker,
        manifest, name, signature, artifact), not its dependencies.
        """
        memo = {} if memo is None else memo

        def reject(reason: str, detail: str) -> Rejection:
            return Rejection(root, leaf, reason, detail)

        name = os.path.basename(leaf)
        try:
            marker = read_bytes(os.path.join(leaf, MARKER), 1024).decode("ascii", "replace").strip()
        except OSError as exc:
            if exc.errno == errno.ENOENT and not os.path.isdir(leaf):
                return reject("gone", "the leaf was removed meanwhile (prune)")
            return reject(_read_reason(exc, "marker"), f"no readable commit marker ({exc.strerror})")
        try:
            raw = read_bytes(os.path.join(leaf, MANIFEST), _MANIFEST_LIMIT)
        except OSError as exc:
            return reject(_read_reason(exc, "manifest"), f"unreadable manifest ({exc.strerror})")
        if digest_bytes(raw) != marker:
            return reject("manifest", "manifest does not match its commit marker")
        try:
            man = parse_manifest(raw)
        except ManifestError as exc:
            return reject("manifest", str(exc))
        if (
            man.build_key != build_key
            or f"deps-{man.deps_key}" != name
            or man.tenant != self.tenant
            or man.backend != self.backend
        ):
            return reject("mismatch", "manifest names another leaf")
        if compute_deps_key(man.deps, man.negatives) != man.deps_key:
            return reject("mismatch", "the listed dependencies do not reproduce the leaf name")
        if self.signer is not None:  # with a key, a leaf from another writer is a miss unless signed
            message = man.signed_message(f"build-{build_key}/{name}")
            if man.signature is None or not self.signer.verify(message, man.signature):
                return reject("signature", "missing or bad signature")
        if anchors is None:
            return self._read_artifact(leaf, root, man, ())
        states = self._trusted_states(leaf, man, anchors)
        if states is None:
            states = []
            for anchor, rel, want in man.deps:
                state = self._rehash(anchors, anchor, rel, memo)
                where = anchors.expand(anchor, rel) or f"{anchor}:{rel}"
                if state is None:
                    return reject("dep_missing", where)
                if isinstance(state, str):
                    return reject(state, where)
                if state[2] != want:
                    return reject("dep_changed", where)
                states.append(state)
            if self.stat_memo is not None:
                self.stat_memo.record(leaf, man.deps_key, [s[1] for s in states])
        absent = []
        for anchor, rel in man.negatives:
            path = anchors.expand(anchor, rel)
            if path is None or os.path.lexists(path):
                return reject("dep_shadowed", path or f"{anchor}:{rel}")
            absent.append(path)
        return self._read_artifact(leaf, root, man, tuple(states), tuple(absent))

    def _trusted_states(self, leaf: str, man: Manifest, anchors: Anchors) -> list[DepState] | None:
        """The deps' states from the stat memo when no stat moved since they last
        verified by rehash; None means: rehash."""
        snaps = self.stat_memo.lookup(leaf, man.deps_key) if self.stat_memo is not None else None
        if snaps is None or len(snaps) != len(man.deps):
            return None
        states: list[DepState] = []
        for (anchor, rel, digest), snap in zip(man.deps, snaps, strict=True):
            path = anchors.expand(anchor, rel)
            if path is None:
                return None
            try:
                st = os.lstat(path)
            except (OSError, ValueError):
                return None
            if stat.S_ISLNK(st.st_mode) or snapshot_of(st) != snap:
                return None
            states.append((path, snap, digest))
        return states

    def _read_artifact(
        self, leaf: str, root: str, man: Manifest, states: tuple[DepState, ...], negatives: tuple[str, ...] = ()
    ) -> VerifiedLeaf | Rejection:
        try:
            limit = min(self.max_artifact_bytes, man.artifact_size)
            artifact = read_bytes(os.path.join(leaf, man.artifact_file), limit)
        except OSError as exc:
            return Rejection(root, leaf, _read_reason(exc, "artifact"), f"artifact unreadable ({exc.strerror})")
        if len(artifact) != man.artifact_size or digest_bytes(artifact) != man.artifact_digest:
            return Rejection(root, leaf, "artifact", "artifact bytes do not match the manifest")
        return VerifiedLeaf(leaf, root, man, artifact, states, negatives)

    @staticmethod
    def _rehash(
        anchors: Anchors, anchor: str, rel: str, memo: dict[str, tuple[str, Snapshot] | None]
    ) -> DepState | str | None:
        """The current state of an anchored dependency, confined to its roots: the file
        it reaches, through any symlink on the way, must lie under one (under the
        linker's roots only for a dep anchored there: the linker's read)."""
        path = anchors.expand(anchor, rel)
        if path is None:
            return "anchor"
        linker = anchor.startswith(LINK_ANCHOR)
        key = f"\0{LINK_ANCHOR}{path}" if linker else path
        if key in memo:
            got = memo[key]
            return None if got is None else (path, got[1], got[0])
        roots = [r for n, r in anchors.roots.items() if linker or not n.startswith(LINK_ANCHOR)]
        try:
            hashed = hash_opened(path, lambda real: any(is_under(real, r) for r in roots))
        except (OSError, ValueError):  # (ValueError: a name the OS cannot take, from a manifest)
            memo[key] = None
            return None
        if hashed is None:
            return "confinement"
        memo[key] = hashed
        return (path, hashed[1], hashed[0])

    # -- publish -------------------------------------------------------------
    def leaf_files(self, build_key: str, manifest: Manifest, artifact: bytes) -> tuple[Manifest, dict[str, bytes]]:
        """The manifest as published (signed, when a key is configured) and the leaf's
        files, ``{name: bytes}``, the marker last. (The last manifest's are remembered:
        the files staged early are asked for again by the publish.)"""
        memo = self._leaf_memo
        if memo is not None and memo[0] is manifest and memo[1] == build_key:
            signed, raw = memo[2], memo[3]
        else:
            signed = manifest
            if self.signer is not None:
                sig = self.signer.sign(manifest.signed_message(f"build-{build_key}/deps-{manifest.deps_key}"))
                signed = dataclasses.replace(manifest, signature=sig)
            raw = signed.to_json()
            self._leaf_memo = (manifest, build_key, signed, raw)
        return signed, {
            manifest.artifact_file: artifact,
            MANIFEST: raw,
            MARKER: digest_bytes(raw).encode() + b"\n",
        }

    def publish(
        self,
        root: str,
        build_key: str,
        manifest: Manifest,
        artifact: bytes,
        dep_states: tuple[DepState, ...],
        negatives: tuple[str, ...] = (),
        workdir: Workdir | None = None,
        early: EarlyWrite | None = None,
    ) -> tuple[VerifiedLeaf, str]:
        """Publish a leaf; returns it with the outcome ``published`` or ``adopted``.
        ``workdir``: a prepared one, whose stage's empty files are filled (else a stage
        is made); ``early``: what of the leaf was written into that stage already.

        Raises ``OSError`` when nothing could be published; a failed publish
        never reports success and never leaves a partial leaf visible.
        """
        name = f"deps-{manifest.deps_key}"
        manifest, files = self.leaf_files(build_key, manifest, artifact)
        bdir = self.build_dir(root, build_key)
        leaf = os.path.join(bdir, name)
        prepared = workdir is not None and workdir.prepared
        stage = workdir.stage if workdir is not None and prepared else self.new_workdir(root)
        # A stage made and fsynced ahead (a spare) has durable entries: filling its files
        # changes none, and their own fsyncs suffice. Creating or removing one does.
        entries_changed = not (prepared and workdir is not None and workdir.synced)
        try:
            # What was written early is used if it holds exactly these bytes, durably.
            # The rest is written first, its writeback started, then fsynced: the disk
            # works on all of it at once, and the later fsyncs find their data written.
            done = early.use(files) if early is not None and prepared and early.stage == stage else frozenset()
            if early is not None and early.dir_changed:
                entries_changed = True
            for n, data in files.items():
                if n in done:
                    continue
                if n == MARKER:
                    faults.point(BEFORE_COMMIT)
                if not write_file(os.path.join(stage, n), data, prepared=prepared, sync=False):
                    entries_changed = True
            if prepared:  # a leaf holds its three files and nothing else
                for extra in set(os.listdir(stage)) - set(files):
                    os.unlink(os.path.join(stage, extra))
                    entries_changed = True
            for n in files:
                if n not in done:
                    fsync_file(os.path.join(stage, n))
            if entries_changed:
                fsync_dir(stage)
            if not prepared:
                os.chmod(stage, 0o755)
            # New build dirs need no fsync of their parents: if a power cut loses the
            # directory entry, the leaf is a miss, never a damaged hit.
            os.makedirs(bdir, exist_ok=True)
            for attempt in (1, 2):
                faults.point("publish.before_rename")
                try:
                    rename(stage, leaf)
                except OSError as exc:
                    if exc.errno == errno.ENOENT and attempt == 1 and os.path.isdir(stage):
                        os.makedirs(bdir, exist_ok=True)  # a concurrent prune removed the empty build dir
                        continue
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                    # Same name, so the winner lists exactly the closure we just hashed:
                    # its own integrity is all that is left to check.
                    winner = self.verify(leaf, root, build_key, None)
                    if isinstance(winner, VerifiedLeaf):
                        adopted = VerifiedLeaf(leaf, root, winner.manifest, winner.artifact, dep_states, negatives)
                        return adopted, "adopted"
                    if winner.reason == "io":
                        # The existing leaf may well be sound; it is just unreadable now. Keep it,
                        # and hand back our own (equivalent) build, unpublished.
                        logger.warning("leaf %s exists but cannot be read (%s); not replacing it", leaf, winner.detail)
                        return VerifiedLeaf("", root, manifest, artifact, dep_states, negatives), "kept"
                    if attempt == 2:
                        # An unreadable winner (EIO...) may be sound: keep it, fail this publish.
                        raise OSError(
                            exc.errno, f"{exc.strerror}; existing leaf unusable: {winner.detail}", leaf
                        ) from exc
                    logger.warning("quarantining %s before publishing over it: %s", leaf, winner.detail)
                    self.quarantine(leaf, root)
                    continue
                faults.point("publish.after_rename")
                # The leaf is complete and durable already; making its new name durable
                # too overlaps the caller's load. A power cut before that fsync loses the
                # name (a later miss), never the leaf's integrity.
                background().submit(_fsync_quietly, bdir)
                stage = ""
                return VerifiedLeaf(leaf, root, manifest, artifact, dep_states, negatives), "published"
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            if stage:
                self.discard(stage, root)

    def quarantine(self, leaf: str, root: str) -> None:
        """Move a damaged leaf aside (same filesystem rename); best effort."""
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: "quarantined"})
        qdir = os.path.join(root, LAYOUT, "quarantine")
        try:
            makedirs_durable(qdir)
            rename(leaf, os.path.join(qdir, f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"))
        except OSError as exc:
            logger.debug("could not quarantine %s: %s", leaf, exc)

    def acquire_lock(self, root: str, build_key: str, timeout: float, workdir: Workdir | None = None) -> Flock | None:
        """Take the per-build-key lock; None when it timed out or is unusable (compile anyway:
        the publish protocol is safe without it). A new lock file is the prepared
        ``workdir``'s empty one, linked into place."""
        path = os.path.join(root, LAYOUT, "locks", f"{build_key}.lock")
        blank = os.path.join(workdir.path, LOCK_BLANK) if workdir is not None and workdir.prepared else None
        try:
            faults.point("lock.acquire")
            lock = lock_file(path, timeout, blank=blank)
        except OSError as exc:
            logger.warning("lock %s unusable (%s); compiling without it", path, exc)
            return None
        if lock is None:
            logger.warning("lock %s not acquired in %.1fs; compiling without it", path, timeout)
        return lock


def _fsync_quietly(path: str) -> None:
    try:
        fsync_dir(path)
    except OSError as exc:
        logger.warning("could not make %s durable: %s (its newest leaf may not survive a power cut)", path, exc)


def _makedirs_quiet(path: str) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(path, exist_ok=True)


def _read_reason(exc: OSError, damaged: str) -> str:
    """A missing, oversized or non-regular file means a damaged leaf; any other read
    error (EIO, EACCES, ...) is the storage's fault: a miss, not a reason to quarantine."""
    return damaged if exc.errno in (errno.ENOENT, errno.EFBIG, errno.EINVAL, errno.ELOOP) else "io"
