"""The disk tier: self-verifying leaves under an ordered list of roots, and the
publish protocol (DESIGN.md §5; paths in ``layout``).

A leaf is a hit only if ``.committed`` holds the digest of ``manifest.json``, the
manifest decodes under the strict schema and names this leaf, its signature verifies
(when keys are configured), its dependencies rehashed *now* reproduce ``<D>`` and its
negatives are absent (``leaf.verify_closure``), and the artifact bytes match the
manifest. Readers take no lock. A leaf that is damaged — or a file or a symlink
standing where a leaf or a build directory should be — is moved aside (quarantine)
when its root is writable, and rebuilt.

Lookup and publish stay in one module on purpose (hence its length, over the style's
400 lines): they are one protocol, each half checked against the other. Work
directories live in ``staging``, file primitives in ``fsio``, the manifest and the
closure check in ``leaf``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import stat
import time
from collections.abc import Sequence
from typing import Any, Final

from .. import _clock, _forksafe, faults
from ..closure.anchors import Anchors
from ..closure.hashing import digest_bytes
from ..closure.scan import DepState
from ..keys import deps_key as compute_deps_key
from ..outcomes import Miss, Outcome, Tier
from ..telemetry import ATTR, SPAN, instruments, span
from .early import EarlyWrite
from .fsio import (
    Flock,
    fsync_dir,
    fsync_file,
    group_writable,
    lock_file,
    makedirs_durable,
    mkdir_shared,
    read_bytes,
    readable_by_group,
    rename,
    shared_dir_mode,
    write_file,
)
from .layout import MANIFEST, MARKER, CacheLayout, is_real_dir
from .leaf import (
    MANIFEST_LIMIT,
    ClosureMemo,
    Manifest,
    ManifestError,
    Negatives,
    Rehashed,
    Rejection,
    Signer,
    VerifiedLeaf,
    Verifier,
    check_signature,
    decode_manifest,
    leaf_files,
    verify_closure,
)
from .staging import LOCK_BLANK, Staging, Workdir, background

__all__ = ["BEFORE_COMMIT", "DiskTier"]

#: Held while a build dir's path is walked and made (``DiskTier._make_build_dir``).
_walking = _forksafe.Lock()

logger = logging.getLogger(__name__)

#: The fault point passed just before a leaf's marker is written into its stage (each
#: time: a leaf staged early and then written again by the publish passes it twice).
BEFORE_COMMIT: Final = "publish.before_commit"
#: How many leaves of one build key a lookup looks at, newest first.
MAX_LEAVES: Final = 64


#: How many times a publish makes its build dir again, removed under it (prune, gc).
_REMAKES: Final = 5


class DiskTier:
    """Lookup and publish over an ordered list of roots (the first writable one takes
    new leaves; the rest are read-only)."""

    tier: Final = Tier.DISK

    def __init__(
        self,
        roots: Sequence[str],
        *,
        tenant: str,
        backend: str,
        signer: Signer | None = None,
        verifier: Verifier | None = None,
        max_artifact_bytes: int = 512 << 20,
        memo: ClosureMemo | None = None,
        staging: Staging | None = None,
    ) -> None:
        self.roots = tuple(os.path.realpath(os.path.expanduser(r)) for r in roots)
        for root in self.roots[1:]:  # (the first is made when it is missing)
            if not os.path.isdir(root):
                logger.warning("cache root %s is no directory (yet): nothing is read from it until it is", root)
        self.tenant = tenant
        self.backend = backend
        self._signer = signer
        self._verifier = verifier
        self._max_artifact_bytes = max_artifact_bytes
        self._memo = memo
        self._staging = staging if staging is not None else Staging("")
        self._attrs = {ATTR.BACKEND: backend, ATTR.TENANT: tenant}
        self._writable: str | None = None
        self._files_memo: tuple[Manifest, Manifest, dict[str, bytes]] | None = None
        #: Why the last search for a writable root found none.
        self.last_error: OSError | None = None

    @property
    def verifier(self) -> Verifier | None:
        return self._verifier

    @property
    def memo(self) -> ClosureMemo | None:
        return self._memo

    # -- roots -----------------------------------------------------------------
    def layout(self, root: str) -> CacheLayout:
        return CacheLayout(root)

    def build_dir(self, root: str, build_key: str) -> str:
        return CacheLayout(root).build_dir(self.tenant, self.backend, build_key)

    def writable_root(self, *, make: bool = True) -> str | None:
        """The first root that can take new entries. A success is remembered while the
        root and its layout are there; a failure is not (a full or flaky disk may
        recover), and its error is kept in ``last_error`` for the caller to report. A
        root that was removed or moved away while this process ran is made again, unless
        not ``make`` (a usage record is no reason to make a cache again). A root that is
        now a symlink is never written through."""
        if isinstance(self._writable, str):
            if self._layout_there(self._writable):
                return self._writable
            self._writable = None
        for root in self.roots:
            try:
                if os.path.islink(root):
                    raise OSError(errno.ELOOP, "cache root is a symlink now (it was resolved when first used)", root)
            except OSError as exc:
                self.last_error = exc
                continue
            layout = CacheLayout(root)
            try:
                if make:
                    makedirs_durable(layout.tmp, root=layout.root)
                    makedirs_durable(layout.locks, root=layout.root)
                if not self._layout_there(root):
                    raise OSError(errno.ENOTDIR, "the cache layout is not made of directories", layout.base)
            except OSError as exc:
                self.last_error = exc
                continue
            if os.access(layout.tmp, os.W_OK | os.X_OK):
                self._writable = root
                return root
            self.last_error = PermissionError(
                errno.EROFS if _read_only(root) else errno.EACCES, "cache root is not writable", root
            )
        return None

    @staticmethod
    def _layout_there(root: str) -> bool:
        """The root, ``v1``, ``tmp`` and ``locks`` are real directories (no symlink)."""
        layout = CacheLayout(root)
        return all(is_real_dir(p) for p in (root, layout.base, layout.tmp, layout.locks))

    # -- lookup ----------------------------------------------------------------
    def lookup(
        self, build_key: str, anchors: Anchors, *, quiet: bool = False, counted: bool = True
    ) -> VerifiedLeaf | Rejection:
        """The newest leaf of ``build_key`` that verifies, in the first root that has
        one; else the first rejection met (``Miss.ABSENT`` when there was no leaf).
        ``quiet`` (explain): no telemetry, nothing moved aside or touched. Not ``counted``
        (a second look for the same request): its span, but no lookup metric."""
        first: Rejection | None = None
        for root in self.roots:
            if quiet:
                hit, rejections = self.lookup_root(root, build_key, anchors, quiet=True)
            else:
                with span(SPAN.DISK_LOOKUP, {ATTR.TIER: "disk", ATTR.ROOT: root, ATTR.BUILD_KEY: build_key}) as s:
                    hit, rejections = self.lookup_root(root, build_key, anchors)
                    self._report(s, rejections, hit, counted)
            if hit is not None:
                if counted and not quiet:
                    instruments.lookup(Tier.DISK, "hit", "verified", self._attrs)
                return hit
            first = first or (rejections[0] if rejections else None)
        missed = first or Rejection(Miss.ABSENT)
        if counted and not quiet:  # (one request, one count: whichever roots it took)
            instruments.lookup(Tier.DISK, "miss", missed.reason, self._attrs)
        return missed

    def lookup_root(
        self, root: str, build_key: str, anchors: Anchors, *, quiet: bool = False
    ) -> tuple[VerifiedLeaf | None, list[Rejection]]:
        """The newest leaf of ``build_key`` in ``root`` that verifies, and why the ones
        before it did not. Damaged leaves met are quarantined when ``root`` is the
        writable one; a hit's mtime is touched (LRU). ``quiet``: neither."""
        rejections: list[Rejection] = []
        # Digests taken for one candidate are reused for the next: a hit's clock starts
        # when the first of them may have been taken, the lookup's start (DESIGN §6).
        rehashed: Rehashed = {}
        since, taken_ns = _clock.now(), time.time_ns()
        for leaf in self._candidates(root, build_key, rejections):
            if quiet:
                result = self.verify(leaf, root, build_key, anchors, rehashed, since=since, taken_ns=taken_ns)
            else:
                with span(SPAN.VERIFY, {ATTR.ROOT: root, "safejit.leaf": os.path.basename(leaf)}) as vs:
                    started = time.perf_counter()
                    result = self.verify(leaf, root, build_key, anchors, rehashed, since=since, taken_ns=taken_ns)
                    instruments.verify_duration.record(time.perf_counter() - started, self._attrs)
                    if isinstance(result, VerifiedLeaf):
                        vs.set_attributes({ATTR.RESULT: "ok", ATTR.DEPS_COUNT: len(result.manifest.deps)})
                    else:
                        vs.set_attributes({ATTR.RESULT: "rejected", ATTR.REASON: result.reason})
            if isinstance(result, VerifiedLeaf):
                if not quiet:
                    with contextlib.suppress(OSError):
                        os.utime(leaf)  # best effort: read-only roots still hit
                    self._quarantine_damaged(root, rejections)
                return result, rejections
            rejections.append(result)
        if not quiet:
            self._quarantine_damaged(root, rejections)
        return None, rejections

    def _quarantine_damaged(self, root: str, rejections: list[Rejection]) -> None:
        if any(rej.reason.corrupt for rej in rejections) and root == self.writable_root():
            for rej in rejections:
                if rej.reason.corrupt and not self.sound_now(rej.leaf, root):
                    self.quarantine(rej.leaf, root)

    def sound_now(self, leaf: str, root: str) -> bool:
        """Whether what ``leaf`` names now is a sound leaf: one pruned and published again
        since it was read (another process's lookup moved the damaged one aside first,
        or a prune) is never moved aside for what the old one was."""
        build = os.path.basename(os.path.dirname(leaf))
        if not build.startswith("build-"):
            return False
        return isinstance(self.verify(leaf, root, build[len("build-") :], None), VerifiedLeaf)

    def _report(self, s: Any, rejections: list[Rejection], hit: VerifiedLeaf | None, counted: bool = True) -> None:
        """One root's span: its result, and an event per leaf rejected; each rejection is
        counted (``reject``) on top of the request's own hit or miss."""
        for rej in rejections:
            event = {ATTR.REASON: rej.reason, "safejit.leaf": rej.leaf, "safejit.detail": rej.detail}
            s.add_event("leaf.rejected", event)
            if counted:
                instruments.lookup(Tier.DISK, "reject", rej.reason, self._attrs)
        if hit is not None:
            s.set_attributes(
                {ATTR.RESULT: "hit", ATTR.DEPS_KEY: hit.manifest.deps_key, ATTR.DEPS_COUNT: len(hit.manifest.deps)}
            )
            return
        s.set_attributes({ATTR.RESULT: "miss", ATTR.REASON: rejections[0].reason if rejections else Miss.ABSENT})

    def _candidates(self, root: str, build_key: str, rejections: list[Rejection]) -> list[str]:
        """Leaves under ``build-<K>`` in one root, newest first. Anything else standing
        there — the build dir or a leaf replaced by a file or a symlink — is reported
        as damaged (never followed)."""
        bdir = self.build_dir(root, build_key)
        try:
            st = os.lstat(bdir)
        except OSError:
            return []
        if not stat.S_ISDIR(st.st_mode):
            rejections.append(Rejection(Miss.DAMAGED, "the build directory is not a directory", bdir, root))
            return []
        entries = []
        try:
            with os.scandir(bdir) as it:
                for e in it:
                    if not e.name.startswith("deps-"):
                        continue
                    try:
                        est = e.stat(follow_symlinks=False)
                    except OSError:
                        continue  # pruned meanwhile: not a candidate
                    if stat.S_ISDIR(est.st_mode):
                        entries.append((est.st_mtime_ns, e.path))
                    else:
                        rejections.append(Rejection(Miss.DAMAGED, "a leaf that is not a directory", e.path, root))
        except OSError:
            return []
        entries.sort(reverse=True)
        return [path for _, path in entries[:MAX_LEAVES]]

    def verify(
        self,
        leaf: str,
        root: str,
        build_key: str,
        anchors: Anchors | None,
        rehashed: Rehashed | None = None,
        *,
        since: float | None = None,
        taken_ns: int | None = None,
    ) -> VerifiedLeaf | Rejection:
        """Check a leaf completely; a :class:`Rejection` says why it is not a hit.

        With ``anchors=None`` only the leaf's own integrity is checked (marker,
        manifest, name, signature, artifact), not its dependencies. ``rehashed``:
        digests taken earlier, reused; ``since``: when the first of them was taken
        (the hit's ``checked``; default: now); ``taken_ns``: the same, wall time (what
        a stat recorded in the memo must not be racy as of).
        """
        checked = _clock.now() if since is None else since
        found = self._manifest(leaf, root, build_key)
        if isinstance(found, Rejection):
            return found
        man = found
        if anchors is None:
            return self._read_artifact(leaf, root, man, (), Negatives(), checked)
        closure = verify_closure(man, anchors, leaf, self._memo, rehashed, taken_ns)
        if isinstance(closure, Rejection):
            return Rejection(closure.reason, closure.detail, leaf, root)
        return self._read_artifact(leaf, root, man, *closure, checked)

    def _manifest(self, leaf: str, root: str, build_key: str) -> Manifest | Rejection:
        """The leaf's manifest, when the leaf is committed, intact, names this leaf and
        is signed as the keys require."""
        name = os.path.basename(leaf)
        try:
            marker = read_bytes(os.path.join(leaf, MARKER), 1024).decode("ascii", "replace").strip()
        except OSError as exc:
            if exc.errno == errno.ENOENT and not os.path.lexists(leaf):
                return Rejection(Miss.GONE, "the leaf was removed meanwhile (prune)", leaf, root)
            return Rejection(_read_reason(exc, Miss.MARKER), f"no readable commit marker ({exc.strerror})", leaf, root)
        try:
            raw = read_bytes(os.path.join(leaf, MANIFEST), MANIFEST_LIMIT)
        except OSError as exc:
            if exc.errno == errno.ENOENT and not os.path.lexists(leaf):
                return Rejection(Miss.GONE, "the leaf was removed meanwhile (prune)", leaf, root)
            return Rejection(_read_reason(exc, Miss.MANIFEST), f"unreadable manifest ({exc.strerror})", leaf, root)
        if digest_bytes(raw) != marker:
            return Rejection(Miss.MANIFEST, "manifest does not match its commit marker", leaf, root)
        try:
            man = decode_manifest(raw)
        except ManifestError as exc:
            return Rejection(Miss.MANIFEST, str(exc), leaf, root)
        if (
            man.build_key != build_key
            or f"deps-{man.deps_key}" != name
            or man.tenant != self.tenant
            or man.backend != self.backend
        ):
            return Rejection(Miss.MISMATCH, "manifest names another leaf", leaf, root)
        if compute_deps_key(man.deps, man.negatives) != man.deps_key:
            return Rejection(Miss.MISMATCH, "the listed dependencies do not reproduce the leaf name", leaf, root)
        bad = check_signature(man, self._verifier)
        if bad is not None:
            return Rejection(bad.reason, bad.detail, leaf, root)
        return man

    def _read_artifact(
        self, leaf: str, root: str, man: Manifest, states: tuple[DepState, ...], negatives: Negatives, checked: float
    ) -> VerifiedLeaf | Rejection:
        if man.artifact_size > self._max_artifact_bytes:
            # Larger than this process allows, as its (signed) manifest says: not read, and
            # not damaged — a process with a larger limit published it, and uses it.
            return Rejection(Miss.OVERSIZE, f"{man.artifact_size} bytes", leaf, root)
        try:
            artifact = read_bytes(os.path.join(leaf, man.artifact_file), man.artifact_size)
        except OSError as exc:
            if exc.errno == errno.ENOENT and not os.path.lexists(leaf):
                return Rejection(Miss.GONE, "the leaf was removed meanwhile (prune)", leaf, root)
            reason = _read_reason(exc, Miss.ARTIFACT)
            return Rejection(reason, f"artifact unreadable ({exc.strerror})", leaf, root)
        if len(artifact) != man.artifact_size or digest_bytes(artifact) != man.artifact_digest:
            return Rejection(Miss.ARTIFACT, "artifact bytes do not match the manifest", leaf, root)
        return VerifiedLeaf(leaf, root, man, artifact, states, negatives, checked=checked)

    # -- publish ---------------------------------------------------------------
    def leaf_files(self, manifest: Manifest, artifact: bytes) -> tuple[Manifest, dict[str, bytes]]:
        """The manifest as published (signed, when a key is configured) and the leaf's
        files, ``{name: bytes}``, the marker last. (The last manifest's are remembered:
        the files staged early are asked for again by the publish.)"""
        memo = self._files_memo
        if memo is not None and memo[0] is manifest and memo[2][manifest.artifact_file] is artifact:
            return memo[1], memo[2]
        signed, files = leaf_files(manifest, artifact, self._signer)
        self._files_memo = (manifest, signed, files)
        return signed, files

    def publish(
        self,
        root: str,
        build_key: str,
        built: VerifiedLeaf,
        workdir: Workdir | None = None,
        early: EarlyWrite | None = None,
    ) -> tuple[VerifiedLeaf, Outcome]:
        """Publish a build; returns the leaf with the outcome ``published``, ``adopted``
        (an equal leaf won the race) or ``kept`` (an existing leaf of that name could not
        be read, and is kept: this build is returned unpublished). ``workdir``: a
        prepared one, whose stage's empty files are filled (else a stage is made);
        ``early``: what of the leaf was written into that stage already.

        Raises ``OSError`` when nothing could be published; a failed publish never
        reports success and never leaves a partial leaf visible.
        """
        manifest, files = self.leaf_files(built.manifest, built.artifact)
        bdir = self.build_dir(root, build_key)
        leaf = os.path.join(bdir, f"deps-{manifest.deps_key}")
        prepared = workdir is not None and workdir.prepared
        stage = workdir.stage if workdir is not None and prepared else self._staging.new_stage(root)
        made = "" if prepared else stage  # (a stage of its own: in use, until let go below)
        synced = prepared and workdir is not None and workdir.synced
        try:
            _fill_stage(stage, files, prepared=prepared, synced=synced, early=early, group=group_writable(root))
            self._make_build_dir(root, bdir)
            # Its age is now: a prepared stage was made up to MAX_AGE_S before, and prune
            # (age, grace, least recently used) judges a leaf by this directory's mtime.
            os.utime(stage)
            published = dataclasses.replace(built, path=leaf, root=root, manifest=manifest)
            for attempt in (1, 2):
                faults.point("publish.before_rename")
                try:
                    self._rename_remaking(stage, leaf, root, bdir)
                except OSError as exc:
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                        raise
                    outcome = self._lost_race(root, build_key, leaf, published, attempt, exc)
                    if outcome is None:
                        continue  # the damaged winner was moved aside: try once more
                    return outcome
                faults.point("publish.after_rename")
                # The leaf is complete and durable already; making its new name durable
                # too overlaps the caller's load. A power cut before that fsync loses the
                # name (a later miss), never the leaf's integrity.
                background().submit(_fsync_quietly, bdir)
                stage = ""
                return published, Outcome.PUBLISHED
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            if stage:
                self._staging.discard(stage, root)
            if made:
                self._staging.let_go(made)

    def _rename_remaking(self, stage: str, leaf: str, root: str, bdir: str) -> None:
        """``rename(stage, leaf)``, the build dir made again each time a concurrent prune or
        gc removed it while empty (as often as one runs meanwhile: a gc at age 0 in a loop
        did it twice, and the publish failed), at most :data:`_REMAKES` times."""
        for _ in range(_REMAKES):
            try:
                rename(stage, leaf)
                return
            except OSError as exc:
                if exc.errno != errno.ENOENT or not os.path.isdir(stage):
                    raise
            self._make_build_dir(root, bdir)
        rename(stage, leaf)

    def _lost_race(
        self, root: str, build_key: str, leaf: str, ours: VerifiedLeaf, attempt: int, exc: OSError
    ) -> tuple[VerifiedLeaf, Outcome] | None:
        """The leaf's name is taken. Same name, so the winner lists exactly the closure we
        just hashed: its own integrity is all that is left to check."""
        winner = self.verify(leaf, root, build_key, None) if is_real_dir(leaf) else None
        if isinstance(winner, VerifiedLeaf):
            # Touched, as a hit is: a leaf older than the newest MAX_LEAVES of its build key
            # is not looked at, and would be rebuilt, and adopted, again and again.
            with contextlib.suppress(OSError):
                os.utime(leaf)
            return dataclasses.replace(ours, manifest=winner.manifest, artifact=winner.artifact), Outcome.ADOPTED
        if winner is not None and winner.reason is Miss.IO:
            # The existing leaf may well be sound; it is just unreadable now. Keep it,
            # and hand back our own (equivalent) build, unpublished.
            logger.warning("leaf %s exists but cannot be read (%s); not replacing it", leaf, winner.detail)
            return dataclasses.replace(ours, path=""), Outcome.KEPT
        detail = winner.detail if winner is not None else "not a directory"
        if attempt == 2:
            raise OSError(exc.errno, f"{exc.strerror}; existing leaf unusable: {detail}", leaf) from exc
        logger.warning("quarantining %s before publishing over it: %s", leaf, detail)
        if not self.quarantine(leaf, root):
            # (the quarantine dir is not a real directory, say: verify and gc report it)
            logger.warning("%s cannot be set aside; this build is returned unpublished", leaf)
            return dataclasses.replace(ours, path=""), Outcome.KEPT
        return None

    def _make_build_dir(self, root: str, bdir: str) -> None:
        """``build-<K>`` and the directories above it as real directories, made without
        following a symlink: anything else standing on the way (a file, a symlink a
        writer of the shared root planted) is moved aside first. New build dirs need no
        fsync of their parents: if a power cut loses the directory entry, the leaf is a
        miss, never a damaged hit."""
        base = CacheLayout(root).base
        # One walk at a time in this process (a compile's publish and the background one its
        # lookup started walk the same path: one moved aside, as "not a directory", what the
        # other had just made in a planted symlink's place, and the other's next mkdir failed).
        # Another process's walk may still do that: the path is walked again, once.
        with _walking:
            for attempt in range(2):
                try:
                    self._walk_to(root, base, bdir)
                    return
                except FileNotFoundError:
                    if attempt:
                        raise

    def _walk_to(self, root: str, base: str, bdir: str) -> None:
        path = base
        group = group_writable(root)
        for part in os.path.relpath(bdir, base).split(os.sep):
            path = os.path.join(path, part)
            try:
                mkdir_shared(path, group=group)
            except FileExistsError:
                if not is_real_dir(path):
                    logger.warning("quarantining %s: not a directory", path)
                    self.quarantine(path, root)
                    mkdir_shared(path, group=group)

    def make_build_dir_later(self, root: str, build_key: str) -> None:
        """Create ``build-<K>`` in the background while the compiler runs (publish makes
        sure of it again; an empty build dir is a plain miss)."""
        background().submit(self._make_build_dir_quietly, root, self.build_dir(root, build_key))

    def _make_build_dir_quietly(self, root: str, bdir: str) -> None:
        with contextlib.suppress(OSError):
            self._make_build_dir(root, bdir)

    def quarantine(self, path: str, root: str) -> bool:
        """Move a damaged leaf (or whatever stands in its place) aside: a same-filesystem
        rename of the entry itself, through descriptors (nothing planted on the way is
        followed); best effort: False when it stays."""
        if not CacheLayout(root).set_aside(path):
            logger.debug("could not quarantine %s", path)
            return False
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: Outcome.QUARANTINED})
        return True

    # -- work dirs and locks ---------------------------------------------------
    def workdir(self, root: str) -> Workdir:
        """A work directory for one compile and its publish (see ``staging``). When the
        layout has vanished meanwhile (the cache dir removed or moved), it is made again."""
        try:
            return self._staging.workdir(root)
        except FileNotFoundError:
            self._writable = None
            if self.writable_root() != root:
                raise
            return self._staging.workdir(root)

    def scratch_in_cache(self, workdir: Workdir) -> Workdir:
        """``workdir`` compiling in the cache root, and every compile after it (memory
        scratch failed: see ``Staging.scratch_in_cache``)."""
        return self._staging.scratch_in_cache(workdir)

    def release_workdir_later(self, workdir: Workdir, root: str) -> None:
        """Delete a work directory in the background and prepare the next ones."""
        self._staging.release_later(workdir, root)

    def acquire_lock(self, root: str, build_key: str, timeout: float, workdir: Workdir | None = None) -> Flock | None:
        """Take the per-build-key lock within ``timeout`` seconds; None when it is held
        elsewhere all that time (the publish protocol is safe without it). Raises
        ``OSError`` when the lock file cannot be used. A new lock file is the prepared
        ``workdir``'s empty one, linked into place."""
        path = CacheLayout(root).lock(build_key)
        blank = os.path.join(workdir.path, LOCK_BLANK) if workdir is not None and workdir.prepared else None
        group = group_writable(root)
        faults.point("lock.acquire")
        try:
            return lock_file(path, timeout, blank=blank, group=group)
        except FileNotFoundError:  # the layout vanished meanwhile: made again, then locked
            makedirs_durable(CacheLayout(root).locks, root=root)
            return lock_file(path, timeout, blank=blank, group=group)
        except OSError as exc:
            if exc.errno not in _NO_LOCK_FILE:
                raise
            # Something that is no lock file stands there (a directory, a link, a FIFO: a
            # writer of a shared root can plant one): set aside, and a lock file made.
            if not self.layout(root).set_aside(path):
                raise
            logger.warning("%s was no lock file (%s): set aside", path, exc.strerror)
            return lock_file(path, timeout, blank=blank, group=group)

    def close(self) -> None:
        self._staging.close()


#: What opening a lock file gives when no regular file stands at its name.
#: (Or one nobody may open: another writer's 0600 or 0000 lock file.)
_NO_LOCK_FILE: Final = frozenset(
    {errno.EISDIR, errno.ELOOP, errno.ENXIO, errno.ENOTDIR, errno.ETXTBSY, errno.EACCES, errno.EPERM}
)


def _fill_stage(
    stage: str, files: dict[str, bytes], *, prepared: bool, synced: bool, early: EarlyWrite | None, group: bool
) -> None:
    """Make ``stage`` hold exactly ``files``, durably (the marker written last); ``group``:
    the root is one a group shares (a stage made here is made so).

    What was written early is used if it holds exactly these bytes, durably. The rest
    is written first, its writeback started, then fsynced: the disk works on all of it
    at once, and the later fsyncs find their data written. A stage made and fsynced
    ahead (``synced``: a spare) has durable entries: filling its files changes none,
    and their own fsyncs suffice; creating or removing one needs the directory's too.
    """
    entries_changed = not synced
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
    if group and not prepared:  # (a prepared stage's blanks were made so)
        for n in files:
            fd = os.open(os.path.join(stage, n), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                readable_by_group(fd)
            finally:
                os.close(fd)
    if entries_changed:
        fsync_dir(stage)
    if not prepared:
        os.chmod(stage, shared_dir_mode(group))


def _fsync_quietly(path: str) -> None:
    try:
        fsync_dir(path)
    except OSError as exc:
        logger.warning("could not make %s durable: %s (its newest leaf may not survive a power cut)", path, exc)


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_reason(exc: OSError, damaged: Miss) -> Miss:
    """A missing, oversized or non-regular file means a damaged leaf; any other read
    error (EIO, EACCES, ...) is the storage's fault: a miss, not a reason to quarantine."""
    return damaged if exc.errno in (errno.ENOENT, errno.EFBIG, errno.EINVAL, errno.ELOOP, errno.ENOTDIR) else Miss.IO
