"""The disk and compile half of the data path: look up, lock, compile, check the
closure, publish — or bypass an unusable cache. Composed by :class:`Runtime`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..backends._argv import artifact_path, depfile_deps, depfile_path, read_lists, tool_reads
from ..backends.base import CompileOutput, Products
from ..cache.disk import BEFORE_COMMIT, DiskCache, Rejection, VerifiedLeaf
from ..cache.fsio import EarlyWrite
from ..cache.leaf import Manifest
from ..cache.staging import Workdir
from ..closure import scan
from ..closure.anchors import Anchors
from ..closure.scan import Closure
from ..config import Config
from ..errors import CacheError, CompileError, LimitExceededError, PolicyError, SafejitError
from ..policy import completeness
from ..policy import roots as root_policy
from ..spec import BuildSpec
from ..telemetry import ATTR, SPAN, instruments, span
from .parts import Setup
from .records import LOG_EVENT_CAP, REASON_TEXT, Counters, lookup_metric, make_manifest, search_dirs

__all__ = ["Builder"]

logger = logging.getLogger("safejit.runtime")


class Builder:
    def __init__(
        self, config: Config, setup: Setup, env: Sequence[tuple[str, str]], counters: Counters, attrs: dict[str, str]
    ) -> None:
        self.config = config
        self.setup = setup
        self.env = env
        self.counters = counters
        self._attrs = attrs

    def obtain(
        self, spec: BuildSpec, key: str, anchors: Anchors, load: Load | None = None
    ) -> tuple[VerifiedLeaf, str, Any]:
        """A verified leaf for ``key``: from disk, or compiled and published; and what
        ``load`` made of it (a fresh build is loaded while it is being published)."""
        leaf = self.disk_lookup(self.setup.disk, key, anchors, spec.name)
        if leaf is not None:
            self.counters.add("disk_hits")
            return leaf, "disk", _load(load, leaf)
        self.counters.add("misses")
        root = self.setup.disk.writable_root()
        if root is None:
            error = self.setup.disk.last_error
            if self.config.on_cache_error == "raise":
                raise CacheError(f"no writable cache root: {error}", errno=getattr(error, "errno", None))
            return self._loaded(self.bypass(spec, key, anchors, f"no writable cache root: {error}"), load)
        try:
            workdir = self.setup.disk.workdir(root)
        except OSError as exc:
            return self._loaded(self.cache_failure(spec, key, anchors, exc), load)
        try:
            with span(SPAN.LOCK_WAIT, {ATTR.ROOT: root}) as s:
                started = time.perf_counter()
                lock = self.setup.disk.acquire_lock(root, key, self.config.lock_timeout_s, workdir)
                waited = time.perf_counter() - started
                s.set_attribute(ATTR.RESULT, "acquired" if lock is not None else "timeout")
                instruments.lock_wait_duration.record(waited, self._attrs)
            try:
                if lock is not None:
                    # Look again under the lock: another process may have just published it.
                    leaf = self.disk_lookup(self.setup.disk, key, anchors, spec.name)
                    if leaf is not None:
                        self.counters.add("disk_hits")
                        return leaf, "disk", _load(load, leaf)
                return self.compile_and_publish(spec, key, anchors, root, workdir, load)
            finally:
                if lock is not None:
                    lock.release()
        finally:
            # The next work dirs are prepared once this compile is done: made while it
            # runs, their fsyncs slow the compiler down (0.2-0.7 ms here).
            self.setup.disk.discard_workdir_later(workdir, root)
            self.setup.disk.refill_later(root)

    @staticmethod
    def _loaded(found: tuple[VerifiedLeaf, str], load: Load | None) -> tuple[VerifiedLeaf, str, Any]:
        return found[0], found[1], _load(load, found[0])

    def disk_lookup(self, disk: DiskCache, key: str, anchors: Anchors, name: str) -> VerifiedLeaf | None:
        rejections: list[Rejection] = []
        for root in disk.roots:
            with span(SPAN.DISK_LOOKUP, {ATTR.TIER: "disk", ATTR.ROOT: root, ATTR.BUILD_KEY: key}) as s:
                before = len(rejections)
                leaf = disk.lookup_root(root, key, anchors, rejections)
                for rej in rejections[before:]:
                    s.add_event(
                        "leaf.rejected",
                        {ATTR.REASON: rej.reason, "safejit.leaf": rej.leaf, "safejit.detail": rej.detail},
                    )
                    lookup_metric("disk", "reject", rej.reason, self._attrs)
                if leaf is not None:
                    s.set_attributes(
                        {
                            ATTR.RESULT: "hit",
                            ATTR.DEPS_KEY: leaf.manifest.deps_key,
                            ATTR.DEPS_COUNT: len(leaf.manifest.deps),
                        }
                    )
                    lookup_metric("disk", "hit", "verified", self._attrs)
                    return leaf
                reason = rejections[-1].reason if len(rejections) > before else "absent"
                s.set_attributes({ATTR.RESULT: "miss", ATTR.REASON: reason})
                lookup_metric("disk", "miss", reason, self._attrs)
        if rejections:
            first = rejections[0]
            logger.info("rebuilding %s: %s (%s)", name, REASON_TEXT.get(first.reason, first.reason), first.detail)
        return None

    def compile(
        self,
        spec: BuildSpec,
        anchors: Anchors,
        workdir: str,
        on_start: Callable[[], None] | None = None,
        on_closed: Callable[[str, bytes], None] | None = None,
    ) -> CompileOutput:
        self.counters.add("compiles")
        waiting = [on_start] if on_start is not None else []

        def started() -> None:  # once: when the compiler has started (or, NVRTC, now)
            if waiting:
                waiting.pop()()

        if getattr(self.setup.backend, "compiles_in_process", False):
            started()  # no process to wait for: the work runs alongside the compile all the same

        with span(SPAN.COMPILER_RUN, {ATTR.SANDBOX: self.setup.sandbox.describe()}) as s:
            try:
                out = self.setup.backend.compile(
                    spec,
                    workdir=workdir,
                    expand=anchors.expand_text,
                    run=self.setup.runner(
                        self.config, self.env, (*spec.toolchain.roots, *spec.toolchain.link_roots), started, on_closed
                    ),
                    timeout=self.config.compile_timeout_s,
                    search_dirs=search_dirs(spec, anchors),
                    confine=lambda path: root_policy.confine(path, anchors, what="header"),
                    max_deps=self.config.max_deps,
                    read_roots=self.setup.read_roots(spec.toolchain.roots),
                )
            except CompileError as exc:
                self.counters.add("errors")
                s.add_event("compiler.log", {"safejit.log": exc.log[:LOG_EVENT_CAP]})
                raise
            finally:
                started()  # (a compile that failed before starting its process)
            s.set_attribute(ATTR.BYTES, len(out.artifact))
            if out.log:
                s.add_event("compiler.log", {"safejit.log": out.log[:LOG_EVENT_CAP]})
        instruments.compile_duration.record(out.seconds, self._attrs)
        self.counters.compile_seconds.append(out.seconds)
        if len(out.artifact) > self.config.max_artifact_bytes:
            raise LimitExceededError(
                f"artifact is {len(out.artifact)} bytes; the limit is {self.config.max_artifact_bytes}",
                limit=self.config.max_artifact_bytes,
            )
        return out

    def build(
        self,
        spec: BuildSpec,
        key: str,
        anchors: Anchors,
        workdir: str,
        root: str,
        on_start: Callable[[], None] | None = None,
        on_artifact: OnArtifact | None = None,
    ) -> tuple[VerifiedLeaf, bool]:
        """Compile and record the closure. Returns the leaf and whether it may be vouched
        for (published, trusted by the memory tier). ``on_artifact(data, manifest)``:
        the compiler has produced its artifact, holding ``data`` (it may yet close it
        again); ``manifest``: the leaf's, if these bytes are the build's (None: not
        known yet)."""
        started_ns = time.time_ns()
        started = time.perf_counter()
        backend = self.setup.backend

        def manifest_of(closure: Closure, data: bytes, products: Products, seconds: float) -> Manifest:
            ext = backend.artifact_ext
            return make_manifest(
                spec, key, closure, self.config, ext, artifact=data, products=products, seconds=seconds
            )

        early: dict[tuple[str, ...], Closure] = {}
        depfile = depfile_path(workdir, spec)
        artifact = artifact_path(workdir, spec, self.setup.backend.artifact_ext)
        # What the assembler and the linker list as read, as they closed their lists.
        lists: dict[str, bytes | None] = dict.fromkeys(read_lists(workdir, spec.argv))

        # (compiler closure, artifact bytes, the tools' lists, the whole closure, the
        # manifest): the early closure found unchanged when the compiler closed its
        # artifact holding those bytes, with what the other tools had read by then.
        held: list[tuple[Closure, bytes, dict[str, bytes | None], Closure, Manifest | None]] = []

        def scan_early(path: str, data: bytes) -> None:
            if path in lists:
                lists[path] = data
                return
            if path == artifact:
                # Whatever the compiler read went into these bytes before it closed them:
                # if the early closure still holds now, it holds for them, however long
                # the driver takes to exit (reads after this close cannot change them).
                # The assembler and the linker have listed what they read by now.
                held.clear()
                found = next(iter(early.items()), None)
                if found is None or None in lists.values() or not scan.unchanged(found[1]):
                    return
                with contextlib.suppress(OSError, ValueError, SafejitError):
                    seen = dict(lists)
                    reads = tool_reads(workdir, found[0], seen, spec.toolchain.link_inputs)
                    closure = scan.merged(found[1], self.reads_closure(spec, anchors, reads, started_ns))
                    # If these bytes are the build's, so is this manifest (the compile's
                    # time: until its artifact was complete).
                    products = None if closure.too_new else backend.products(data)
                    manifest = None
                    if products is not None:
                        manifest = manifest_of(closure, data, products, time.perf_counter() - started)
                    held.append((found[1], data, seen, closure, manifest))
                    # Staged early only once all it was made of is known to be confined.
                    if on_artifact is not None:
                        on_artifact(data, manifest)
                return
            # The compiler has written its depfile; its assembler and linker still run.
            # Scanning now takes the scan off the caller's time; it is used only if the
            # final depfile names the very same files and none of them has changed before
            # the artifact's last close (or, failing that, the compiler's exit).
            # Any failure is left to the late scan.
            if path != depfile:
                return
            early.clear()
            held.clear()
            with contextlib.suppress(OSError, ValueError, SafejitError):
                deps, complete = depfile_deps(depfile, spec, data)
                if complete:
                    early[deps] = self.closure(spec, anchors, deps, started_ns, early=True)

        out = self.compile(spec, anchors, workdir, on_start, scan_early)
        closure = early.get(out.deps)
        hold = held[0] if held else None
        manifest = None
        if (
            closure is not None
            and hold
            and hold[0] is closure
            and hold[1] is out.artifact
            and hold[2] == out.read_lists
        ):
            closure = hold[3]  # checked at the close that made these very bytes
            if hold[4] is not None and (hold[4].kernels, hold[4].meta) == (out.kernels, out.meta):
                manifest = hold[4]
        else:
            if closure is None or not scan.unchanged(closure):
                closure = self.closure(spec, anchors, out.deps, started_ns, absent=out.absent)
            closure = scan.merged(closure, self.tools_closure(spec, anchors, workdir, out, started_ns))
        if closure.too_new:
            # A dependency changed within a clock tick of the compile: what the compiler read
            # is unknown. Once the tick has passed, compile again; vouch only for a clean run.
            logger.info("%s changed while %s compiled; compiling again", closure.too_new[0], spec.name)
            time.sleep(scan.COARSE_NS / 1e9)
            started_ns = time.time_ns()
            out = self.compile(spec, anchors, workdir)
            closure = scan.merged(
                self.closure(spec, anchors, out.deps, started_ns, absent=out.absent),
                self.tools_closure(spec, anchors, workdir, out, started_ns),
            )
        if manifest is None:
            manifest = manifest_of(closure, out.artifact, (out.kernels, out.meta), out.seconds)
        leaf = VerifiedLeaf("", root, manifest, out.artifact, tuple(closure.states), tuple(closure.negative_paths))
        if out.complete and not closure.too_new:
            return leaf, True
        # What the compiler read is not what was hashed (or is unknown): the build may be returned
        # once, but nothing may vouch for it later — not the disk tier, and not the memory tier
        # (its entry fails its first revalidation).
        changed = set(closure.too_new)
        unvouched = tuple((p, snap, "" if p in changed else d) for p, snap, d in closure.states)
        why = f"{closure.too_new[0]} changed during compile" if closure.too_new else "the dependency scan is incomplete"
        logger.warning("not caching %s: %s; it will be rebuilt next time", spec.name, why)
        self.counters.add("not_published")
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: "skipped"})
        return dataclasses.replace(leaf, dep_states=unvouched, closure_known=out.complete), False

    def compile_and_publish(
        self, spec: BuildSpec, key: str, anchors: Anchors, root: str, workdir: Workdir, load: Load | None = None
    ) -> tuple[VerifiedLeaf, str, Any]:
        disk = self.setup.disk

        def while_compiling() -> None:  # filesystem work the compile does not wait for
            disk.make_build_dir_later(root, key)

        # The leaf is staged as soon as the compiler closes its artifact (its driver takes
        # another millisecond or two to exit, which this thread spends waiting), and
        # fsynced in the background.
        early = EarlyWrite(workdir.stage) if workdir.prepared else None

        def on_artifact(data: bytes, manifest: Manifest | None) -> None:
            assert early is not None
            if manifest is None:
                early.write({f"artifact.{self.setup.backend.artifact_ext}": data})
            else:  # (the marker last)
                early.write(disk.leaf_files(key, manifest, data)[1], before_last=BEFORE_COMMIT)

        try:
            leaf, clean = self.build(
                spec, key, anchors, workdir.scratch, root, while_compiling, on_artifact if early else None
            )
        except BaseException:
            if early is not None:
                early.cancel()  # (before the work dir is deleted: no write may land in it after)
            raise
        if not clean:
            if early is not None:
                early.cancel()
            return leaf, "compiled", _load(load, leaf)
        manifest = leaf.manifest
        with span(SPAN.PUBLISH, {ATTR.DEPS_KEY: manifest.deps_key, ATTR.DEPS_COUNT: len(manifest.deps)}) as s:
            try:
                published, outcome = disk.publish(
                    root, key, manifest, leaf.artifact, leaf.dep_states, leaf.negatives, workdir, early
                )
            except OSError as exc:
                s.set_attribute(ATTR.OUTCOME, "failed")
                instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: "failed"})
                if self.config.on_cache_error == "raise":
                    raise CacheError(f"publishing {spec.name} failed: {exc}", path=root, errno=exc.errno) from exc
                self.note_bypass(f"publish failed: {exc}")
                return leaf, "bypass", _load(load, leaf)
            s.set_attribute(ATTR.OUTCOME, outcome)
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: outcome})
        self.counters.add("not_published" if outcome == "kept" else outcome)
        return published, "disk" if outcome == "adopted" else "compiled", _load(load, published)

    def cache_failure(self, spec: BuildSpec, key: str, anchors: Anchors, exc: OSError) -> tuple[VerifiedLeaf, str]:
        if self.config.on_cache_error == "raise":
            raise CacheError(f"the disk cache cannot be used: {exc}", errno=exc.errno) from exc
        return self.bypass(spec, key, anchors, str(exc))

    def bypass(self, spec: BuildSpec, key: str, anchors: Anchors, why: str) -> tuple[VerifiedLeaf, str]:
        if self.config.on_cache_error == "raise":
            raise CacheError(f"the disk cache cannot be used: {why}")
        self.note_bypass(why)
        workdir = tempfile.mkdtemp(prefix="safejit-bypass-")
        try:
            leaf, _ = self.build(spec, key, anchors, workdir, "")
            return leaf, "bypass"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def tools_closure(
        self, spec: BuildSpec, anchors: Anchors, workdir: str, out: CompileOutput, started_ns: int
    ) -> Closure:
        """The closure of what the assembler and the linker read (their lists in ``out``),
        the toolchain's own link inputs aside (they are in its digest). Raises
        ``CompileError`` when a list is missing or malformed: what they read is then
        unknown, and the build is refused."""
        try:
            reads = tool_reads(workdir, out.deps, out.read_lists, spec.toolchain.link_inputs)
        except ValueError as exc:
            raise CompileError(f"{spec.name}: {exc}; refusing the build", log=out.log, argv=out.argv) from None
        return self.reads_closure(spec, anchors, reads, started_ns)

    def reads_closure(
        self, spec: BuildSpec, anchors: Anchors, reads: dict[str, tuple[str, ...]], started_ns: int
    ) -> Closure:
        """The closure of what each tool read: the assembler's (what inline asm names)
        confined like includes, the linker's also under the linker's roots."""
        closure = _NO_CLOSURE
        for tool, deps in reads.items():
            part = self.closure(spec, anchors, deps, started_ns, tools=True, linker=tool == "linker")
            closure = scan.merged(closure, part)
        return closure

    def closure(
        self,
        spec: BuildSpec,
        anchors: Anchors,
        deps: Sequence[str],
        started_ns: int,
        *,
        early: bool = False,
        tools: bool = False,
        linker: bool = False,
        absent: Sequence[str] | None = None,
    ) -> Closure:
        """The closure of ``deps``, confined and hashed. ``early``: a scan while the
        compiler still runs, which a later one may repeat (its violations are not counted).
        ``tools``: files the assembler or linker read (no includes, no negatives);
        ``linker``: the linker's (which may also lie under its roots); ``absent``: the
        compiler's recorded failed lookups (see ``CompileOutput.absent``)."""
        if tools and not deps:
            return _NO_CLOSURE
        with span(SPAN.POLICY_CHECK, {ATTR.KIND: "completeness"}) as s:
            try:
                return completeness.record_closure(
                    deps,
                    anchors,
                    max_deps=self.config.max_deps,
                    started_ns=started_ns,
                    search_dirs=() if tools else search_dirs(spec, anchors),
                    source=b"" if tools else spec.code,
                    trust_stat=self.config.trust_stat,
                    includes=not tools,
                    linker=linker,
                    absent=absent,
                )
            except (PolicyError, LimitExceededError) as exc:
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                if not early:
                    instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                raise
            except OSError as exc:  # (a listed file that is no regular file, or unreadable)
                raise CompileError(
                    f"{spec.name}: a file the build read cannot be hashed: {exc.filename}: {exc.strerror}", log=""
                ) from None

    def note_bypass(self, why: str) -> None:
        logger.warning("safejit cache bypassed: %s; the kernel is compiled privately and not cached", why)
        self.counters.add("bypass")
        instruments.bypass.add(1, self._attrs)


Load = Callable[[VerifiedLeaf], Any]
OnArtifact = Callable[[bytes, Manifest | None], None]


_NO_CLOSURE = Closure([], [], [], [], [])


def _load(load: Load | None, leaf: VerifiedLeaf) -> Any:
    return load(leaf) if load is not None else None
