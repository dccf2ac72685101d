"""The data path below the memory tier (DESIGN.md §1): look the key up in the disk
tier, take the build lock, look again, compile (:class:`~.build_job.BuildJob`),
publish, load — or, when the cache cannot be used and ``on_cache_error="bypass"``,
compile privately. Whether a cache failure raises or bypasses is decided in one
place: :func:`cache_errors` turns every OS error of the cache's own files into a
:class:`~safejit.errors.CacheError` (with its errno), and :meth:`Pipeline.obtain`
alone decides what a CacheError means.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import _clock
from ..cache.disk import BEFORE_COMMIT
from ..cache.early import EarlyWrite
from ..cache.layout import CacheLayout
from ..cache.leaf import Manifest, VerifiedLeaf
from ..cache.staging import Workdir, background
from ..config import Config
from ..errors import CacheError, CompileError, SafejitError
from ..outcomes import Miss, Outcome, Tier
from ..telemetry import ATTR, SPAN, in_this_context, instruments, span
from .build_job import BuildJob
from .parts import Parts
from .records import Counters, HeldCounts
from .resolve import Resolved

__all__ = ["Load", "Obtained", "Pipeline", "cache_errors"]

logger = logging.getLogger("safejit.runtime")

#: Loads a verified leaf's bytes (the backend's library), or None when nothing is loaded.
Load = Callable[[VerifiedLeaf], Any]

#: Errors of a compiler writing into a full or broken cache filesystem (scratch="cache").
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
#: A diagnostic at a line of a source: ``f.c:3:14: error:`` (gcc, clang, bisheng),
#: ``f.cu(3): error:`` (nvcc, NVRTC).
_SOURCE_DIAGNOSTIC = re.compile(r":\d+:\d+: (?:fatal )?error:|\(\d+\): (?:catastrophic )?error:")


@dataclass(frozen=True, slots=True)
class Obtained:
    """A verified leaf, where it came from, and what ``load`` made of it."""

    leaf: VerifiedLeaf
    tier: Tier
    library: Any


@contextlib.contextmanager
def cache_errors(what: str) -> Iterator[None]:
    """Every OS error of the cache's own files, raised in the block, as a CacheError
    (safejit's own errors pass through: a PolicyError is a PermissionError, a
    CompileTimeout a TimeoutError, and neither is the cache's)."""
    try:
        yield
    except SafejitError:
        raise
    except OSError as exc:
        raise CacheError(f"{what}: {exc}", errno=exc.errno, path=exc.filename) from exc


class Pipeline:
    """Disk lookup, lock, build, publish and load for resolved requests."""

    def __init__(self, config: Config, parts: Parts, counters: Counters, attrs: Mapping[str, str]) -> None:
        self.config = config
        self.parts = parts
        self.counters = counters
        self._attrs = dict(attrs)

    def obtain(self, resolved: Resolved, load: Load | None = None) -> Obtained:
        """A verified leaf for ``resolved``: from disk, or compiled and published; and
        what ``load`` made of it (a fresh build is loaded while it is being published)."""
        try:
            with cache_errors("the disk cache cannot be used"):
                return self._obtain(resolved, load)
        except CacheError as exc:
            if self.config.on_cache_error == "raise":
                raise
            return self._bypass(resolved, load, str(exc))

    def _obtain(self, resolved: Resolved, load: Load | None) -> Obtained:
        disk = self.parts.disk
        found = disk.lookup(resolved.key, resolved.anchors)
        if isinstance(found, VerifiedLeaf):
            self.counters.add("disk_hits")
            logger.debug("disk hit for %s: %s", resolved.spec.name, found.path)
            return Obtained(found, Tier.DISK, _load(load, found))
        self.counters.add("misses")
        if found.reason is not Miss.ABSENT:
            logger.info("rebuilding %s: %s (%s)", resolved.spec.name, found.reason.text, found.detail)
        root = disk.writable_root()
        if root is None:
            error = disk.last_error
            raise CacheError(
                f"no writable cache root: {error} (give Config.cache_dirs, SAFEJIT_CACHE_DIRS, a directory this "
                "user may write; or on_cache_error='bypass' to compile without caching)",
                errno=getattr(error, "errno", None),
            )
        workdir = disk.workdir(root)
        lock = None
        try:
            lock, published = self._wait_for_lock(resolved, root, workdir)
            if published is None and lock is not None:
                # Look again under the lock: another process may have just published it. (Its
                # span is made, not counted: one request is one disk lookup on the dashboards.)
                again = disk.lookup(resolved.key, resolved.anchors, counted=False)
                published = again if isinstance(again, VerifiedLeaf) else None
            if published is not None:
                self.counters.add("disk_hits")
                return Obtained(published, Tier.DISK, _load(load, published))
            if self.parts.remote is None:
                return self._build_and_publish(resolved, root, workdir, load)
            obtained, lock = self._through_remote(resolved, root, workdir, load, lock)
            return obtained
        finally:
            if lock is not None:
                lock.release()
            disk.release_workdir_later(workdir, root)

    def _through_remote(
        self, resolved: Resolved, root: str, workdir: Workdir, load: Load | None, lock: Any
    ) -> tuple[Obtained, Any]:
        """Below the disk, under this node's build lock (one process per node asks the
        remote): a leaf another node published, verified here; else this node compiles —
        holding the fleet's lease on the key if it can get it, or after watching another
        node's lease until it publishes (or its holder dies: then exactly one waiter takes
        over). Returns what to return, and the local lock if it is still this caller's
        to release (a remote hit hands it to the backfill, which releases it once the
        disk has the leaf: the node's other processes then find it there)."""
        remote = self.parts.remote
        assert remote is not None
        key = resolved.key
        first = remote.lookup(key, resolved.anchors, counted=False)
        got: VerifiedLeaf | Any = first
        lease = None
        if not isinstance(got, VerifiedLeaf):
            deadline = time.monotonic() + self.config.compile_timeout_s + self.config.remote_lease_ttl_s
            got = remote.claim(key, resolved.anchors, deadline=deadline)
            if not isinstance(got, VerifiedLeaf):
                lease = got
        remote.count(got if isinstance(got, VerifiedLeaf) else first)  # (a leaf through the lease is a hit)
        if isinstance(got, VerifiedLeaf):
            self.counters.add("remote_hits")
            background().submit(in_this_context(self._backfill), root, key, got, lock)
            return Obtained(got, Tier.REMOTE, _load(load, got)), None
        keeper = remote.keep(lease) if lease is not None else None
        try:
            obtained = self._build_and_publish(resolved, root, workdir, load)
        except BaseException:
            if keeper is not None:
                keeper.stop()  # (releases the lease: another node may compile it)
            raise
        if obtained.leaf.path and obtained.tier is not Tier.BYPASS:
            remote.offer(key, obtained.leaf, keeper)  # (it keeps the lease until the leaf is there)
        elif keeper is not None:
            keeper.stop()
        return obtained, lock

    def _backfill(self, root: str, key: str, leaf: VerifiedLeaf, lock: Any) -> None:
        """Publish a remote hit to the disk tier (off the hit path), then let the local
        build lock go."""
        try:
            man = leaf.manifest
            attrs = {ATTR.DEPS_KEY: man.deps_key, ATTR.DEPS_COUNT: len(man.deps), ATTR.TIER: Tier.REMOTE}
            with span(SPAN.PUBLISH, attrs) as s:
                _, outcome = self.parts.disk.publish(root, key, leaf)
                s.set_attribute(ATTR.OUTCOME, outcome)
            instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: outcome})
        except (OSError, SafejitError) as exc:
            logger.warning("could not keep the remote's leaf on disk: %s", exc)
        finally:
            if lock is not None:
                lock.release()

    def _wait_for_lock(self, resolved: Resolved, root: str, workdir: Workdir) -> tuple[Any, VerifiedLeaf | None]:
        """The build lock, or the leaf another process published while this one waited
        for it (the disk is looked at again every half second or so: a holder that
        stopped, or a reader that took the lock file, does not hold up a published
        leaf); ``(None, None)`` when the wait ran out: compile anyway."""
        disk = self.parts.disk
        with span(SPAN.LOCK_WAIT, {ATTR.ROOT: root}) as s:
            started = time.perf_counter()
            deadline = time.monotonic() + self.config.lock_timeout_s
            step = 0.05
            lock, found = None, None
            while True:
                lock = disk.acquire_lock(root, resolved.key, min(step, max(deadline - time.monotonic(), 0.0)), workdir)
                if lock is not None or time.monotonic() >= deadline:
                    break
                again = disk.lookup(resolved.key, resolved.anchors, quiet=True)
                if isinstance(again, VerifiedLeaf):
                    found = again
                    break
                step = min(step * 2, 0.5)
            result = "acquired" if lock is not None else "found" if found is not None else "timeout"
            s.set_attribute(ATTR.RESULT, result)
            instruments.lock_wait_duration.record(time.perf_counter() - started, self._attrs)
        if result == "timeout":
            logger.warning(
                "build lock %s (%s) not acquired in %.1fs; compiling without it",
                CacheLayout(root).lock(resolved.key), resolved.spec.name, self.config.lock_timeout_s,
            )  # fmt: skip
        return lock, found

    def _build_and_publish(self, resolved: Resolved, root: str, workdir: Workdir, load: Load | None) -> Obtained:
        """Compile and publish; once more with the compiler in the cache root when its
        scratch in memory was full (/dev/shm is small in many containers): that is no
        failure of the disk cache, nor of the source."""
        if workdir.scratch == workdir.path:
            return self._build_in(resolved, root, workdir, load, self.counters)
        held = HeldCounts(self.counters)  # (a compile run again is one compile, no error)
        try:
            obtained = self._build_in(resolved, root, workdir, load, held)
        except (OSError, CompileError) as exc:
            if not _scratch_full(workdir.scratch, exc):
                held.keep()
                raise
            logger.warning(
                "no room for %s's compile in memory (%s); compiling in the cache root",
                resolved.spec.name,
                workdir.scratch,
            )
        except BaseException:
            held.keep()
            raise
        else:
            held.keep()
            return obtained
        return self._build_in(resolved, root, self.parts.disk.scratch_in_cache(workdir), load, self.counters)

    def _build_in(
        self, resolved: Resolved, root: str, workdir: Workdir, load: Load | None, counters: Counters
    ) -> Obtained:
        disk = self.parts.disk
        key = resolved.key
        # The leaf is staged as soon as the compiler closes its artifact (its driver takes
        # another millisecond or two to exit, which this thread spends waiting), and
        # fsynced in the background. Not where the compiler works in the work dir itself
        # (its scratch in the cache root): the stage there is within what it may write,
        # and a compiler subverted by its input could fill it with a leaf of its own,
        # self-consistent, published for the next process to load. Its leaf is staged
        # only once it has exited, in a stage it never could reach.
        exposed = workdir.scratch == workdir.path
        early = EarlyWrite(workdir.stage) if workdir.prepared and not exposed else None

        def on_artifact(data: bytes, manifest: Manifest | None) -> None:
            assert early is not None
            if manifest is None:
                early.write({f"artifact.{self.parts.backend.artifact_ext}": data})
            else:  # (the marker last)
                early.write(disk.leaf_files(manifest, data)[1], before_last=BEFORE_COMMIT)

        job = self._job(
            resolved,
            on_start=lambda: disk.make_build_dir_later(root, key),  # work the compile does not wait for
            on_artifact=on_artifact if early is not None else None,
            counters=counters,
        )
        started = _clock.now()
        try:
            built = self._run(job, workdir.scratch, root)
        except BaseException:
            if early is not None:
                early.cancel()  # (before the work dir is deleted: no write may land in it after)
            raise
        same = built.toolchain_same  # (checked at the artifact's close; else now)
        changed = built.vouched and not (
            same if same is not None else self.parts.backend.toolchain_unchanged(resolved.spec, started)
        )
        if changed:  # (its compiler was replaced since it was probed: built by which one?)
            logger.warning(
                "not caching %s: its toolchain changed since it was probed; it is probed again", resolved.spec.name
            )
            self.counters.outcome(Outcome.SKIPPED)
            instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: Outcome.SKIPPED})
        if not built.vouched or changed:
            if early is not None:
                early.cancel()
            return Obtained(built.leaf, Tier.COMPILED, _load(load, built.leaf))
        manifest = built.leaf.manifest
        with span(SPAN.PUBLISH, {ATTR.DEPS_KEY: manifest.deps_key, ATTR.DEPS_COUNT: len(manifest.deps)}) as s:
            try:
                with cache_errors(f"publishing {resolved.spec.name} failed"):
                    published, outcome = disk.publish(root, key, built.leaf, None if exposed else workdir, early)
            except CacheError as exc:
                s.set_attribute(ATTR.OUTCOME, Outcome.FAILED)
                instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: Outcome.FAILED})
                if self.config.on_cache_error == "raise":
                    raise
                self._note_bypass(str(exc))
                return Obtained(built.leaf, Tier.BYPASS, _load(load, built.leaf))
            s.set_attribute(ATTR.OUTCOME, outcome)
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: outcome})
        self.counters.outcome(outcome)
        tier = Tier.DISK if outcome is Outcome.ADOPTED else Tier.COMPILED
        return Obtained(published, tier, _load(load, published))

    def _run(self, job: BuildJob, workdir: str, root: str) -> Any:
        """Run ``job`` in ``workdir`` (in the cache root ``root``, or a private dir when
        ``root`` is empty). A compiler that failed because the cache's filesystem is full
        or broken (its scratch there: ``scratch="cache"``) is the cache's failure."""
        name = job.spec.name
        logger.info("compiling %s (%s, build key %s)", name, self.config.backend, job.key[:16])
        started = time.perf_counter()
        try:
            built = job.run(workdir)
        except CompileError as exc:
            first = (str(exc).splitlines() or [""])[0]  # (the compiler's log follows: CompileError.log)
            logger.info("compiling %s failed after %.3fs: %s", name, time.perf_counter() - started, first)
            if root and os.path.commonpath([workdir, root]) == root and _storage_failed(root, exc.log):
                raise CacheError(
                    f"the compiler could not write its scratch files in the cache root: {exc.log[-500:]}",
                    errno=errno.ENOSPC,
                    path=root,
                ) from exc
            raise
        logger.info("compiled %s in %.3fs", name, time.perf_counter() - started)
        return built

    def _job(
        self,
        resolved: Resolved,
        *,
        on_start: Callable[[], None] | None = None,
        on_artifact: Callable[[bytes, Manifest | None], None] | None = None,
        counters: Counters | None = None,
    ) -> BuildJob:
        return BuildJob(
            self.parts,
            self.config,
            resolved.spec,
            resolved.key,
            resolved.anchors,
            self.counters if counters is None else counters,
            self._attrs,
            on_start=on_start,
            on_artifact=on_artifact,
        )

    def _bypass(self, resolved: Resolved, load: Load | None, why: str) -> Obtained:
        """Compile privately, publish nothing: the kernel works; the cache is not used."""
        self._note_bypass(why)
        # (in a private dir of its own: a work dir's parent is where a source's "../../x"
        # is looked for next to it, completeness.first_lookup_outside — not the shared /tmp)
        scratch = tempfile.mkdtemp(prefix="safejit-bypass-")
        try:
            workdir = os.path.join(scratch, "w")
            os.mkdir(workdir, 0o700)
            built = self._job(resolved).run(workdir)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return Obtained(built.leaf, Tier.BYPASS, _load(load, built.leaf))

    def _note_bypass(self, why: str) -> None:
        logger.warning("safejit cache bypassed: %s; the kernel is compiled privately and not cached", why)
        self.counters.add(Tier.BYPASS.value)
        instruments.bypass.add(1, self._attrs)


def _scratch_full(scratch: str, exc: OSError | CompileError) -> bool:
    """Whether ``exc`` is a compile's own scratch dir (in memory) failing it: an error
    writing there (the cache's own are CacheErrors), or the compiler's saying so while
    that filesystem is (nearly) full — its temporary files gone, what was left before."""
    if isinstance(exc, CacheError):
        return False
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not any(os.strerror(code) in exc.log for code in (errno.ENOSPC, errno.EDQUOT)):
        return False  # (an assembler's or linker's own error names no line of a source either)
    try:
        st = os.statvfs(scratch)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(4 << 20, st.f_blocks * st.f_frsize // 20)


def _storage_failed(root: str, log: str) -> bool:
    """Whether a compiler's failure says its filesystem failed it, or, when it names no
    line of a source as the reason (tools cut short by a full disk often say nothing
    useful), that filesystem has no room left. A source's own error stays the caller's."""
    if any(os.strerror(code) in log for code in _STORAGE_ERRNOS):
        return True
    if _SOURCE_DIAGNOSTIC.search(log):
        return False
    with contextlib.suppress(OSError):
        st = os.statvfs(root)
        return st.f_bavail * st.f_frsize < 64 * 1024
    return False


def _load(load: Load | None, leaf: VerifiedLeaf) -> Any:
    return load(leaf) if load is not None else None
