"""One compile and the closure of what it read, as a job with its state in fields.

The closure is scanned twice at most. Early, while the compiler still runs: when it
has listed what it read (its assembler and linker run on), and again when it closes
its artifact — if nothing it listed has changed by then, the closure holds for those
very bytes, and the leaf can be staged before the driver even exits. Late, after the
compiler exits, for whatever the early scan could not vouch for. A dependency that
changed within a clock tick of the compile means what the compiler read is unknown:
the job compiles once more, and vouches only for a clean run.

Past the style's ~450 lines: the job's events while the compiler runs (the depfile,
the records, the artifact's close) and the checks after it share the job's state —
what each event found is what the check after the compile reuses — so they stay in
one class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

from .. import _clock
from ..backends.base import CompileContext, CompileOutput, Products
from ..cache.leaf import Manifest, Negatives, VerifiedLeaf
from ..closure import scan
from ..closure.anchors import LINK_ANCHOR, LOOKED_OUTSIDE, Anchors
from ..closure.hashing import Snapshot
from ..closure.scan import Closure
from ..config import Config
from ..errors import (
    CompileError,
    CompileTimeout,
    LimitExceededError,
    PolicyError,
    SafejitError,
    UndeclaredDependencyError,
)
from ..outcomes import Outcome
from ..policy import completeness
from ..policy import roots as root_policy
from ..sandbox import lookups
from ..spec import BuildSpec
from ..telemetry import ATTR, SPAN, instruments, span
from .parts import Parts
from .records import LOG_EVENT_CAP, Counters, backend_meta, make_manifest, search_dirs

__all__ = ["BuildJob", "Built", "OnArtifact"]

logger = logging.getLogger("safejit.runtime")

#: ``on_artifact(data, manifest)``: the compiler closed its artifact holding ``data``;
#: ``manifest``: the leaf's, if these bytes are the build's (None: not known yet).
OnArtifact = Callable[[bytes, Manifest | None], None]

_NO_CLOSURE = Closure([], [], [], [], [])


@dataclasses.dataclass(frozen=True, slots=True)
class Built:
    """A build: its leaf (not yet published: ``path`` is empty) and whether it may be
    vouched for (published, trusted by the memory tier)."""

    leaf: VerifiedLeaf
    vouched: bool
    #: Whether the toolchain was found unchanged since the build began, checked when the
    #: compiler closed these very bytes (its tools had all run); None: not checked yet.
    toolchain_same: bool | None = None


@dataclasses.dataclass(slots=True)
class _Held:
    """The closure found unchanged when the compiler closed its artifact holding
    ``artifact``, with what the other tools had read by then, and the manifest made
    for those bytes (None: not known from the bytes alone)."""

    listed: Closure
    artifact: bytes
    tool_reads: Mapping[str, tuple[str, ...]]
    closure: Closure
    manifest: Manifest | None
    #: When the check that found the closure unchanged began (``_clock.now()``).
    checked: float
    #: The directories that vouch for the negatives (``scan.negative_dirs``).
    dirs: list[tuple[str, Snapshot]]


class BuildJob:
    """Compile ``spec`` once (twice if a dependency changed during the first run) and
    record its closure. ``on_start``: work to overlap with the compiler, run once it
    has started; ``on_artifact``: see :data:`OnArtifact`."""

    def __init__(
        self,
        parts: Parts,
        config: Config,
        spec: BuildSpec,
        key: str,
        anchors: Anchors,
        counters: Counters,
        attrs: Mapping[str, str],
        *,
        on_start: Callable[[], None] | None = None,
        on_artifact: OnArtifact | None = None,
    ) -> None:
        self.parts = parts
        self.config = config
        self.spec = spec
        self.key = key
        self.anchors = anchors
        self.counters = counters
        self._attrs = attrs
        self._on_start = on_start
        self._on_artifact = on_artifact
        self._search_dirs = search_dirs(spec, anchors)
        self._started_ns = 0
        self._started = 0.0
        #: The compiler's own listing, its closure as scanned early, and the directories
        #: that vouch for its negatives (``scan.negative_dirs``).
        self._early: tuple[tuple[str, ...], Closure, list[tuple[str, Snapshot]]] | None = None
        self._held: _Held | None = None
        #: What the last compile's preprocessors were recorded looking up (None: not
        #: recorded), or why the records were lost.
        self._looked: tuple[tuple[str, bool | None], ...] | str | None = None
        self._workdir = ""  # (the last compile's)
        #: The last compile's records as read while it ran (None: not recorded), and the
        #: check of what they name (its walk kept for the check after the compile).
        self._records: lookups.Records | None = None
        self._check: completeness.OutsideCheck | None = None
        #: The artifact's bytes at its last close, and whether the toolchain was unchanged
        #: then; when the build began (``_clock``).
        self._toolchain_at_close: tuple[bytes, bool] | None = None
        self._since = 0.0

    # -- events from the compile (CompileEvents) ----------------------------------
    def started(self) -> None:
        waiting, self._on_start = self._on_start, None
        if waiting is not None:
            waiting()

    def listed(self, deps: tuple[str, ...], complete: bool) -> None:
        """The compiler has written its depfile; its assembler and linker still run.
        Scanning now takes the scan off the caller's time; it is used only if the final
        depfile names the very same files and none of them has changed before the
        artifact's last close (or, failing that, the compiler's exit). Any failure is
        left to the late scan."""
        self._early = None
        self._held = None
        if complete:
            with contextlib.suppress(OSError, ValueError, SafejitError):
                closure = self._closure(deps, early=True)
                # (None: a negative is there already; the late scan says what it means)
                dirs = scan.negative_dirs(closure.negative_paths)
                if dirs is not None:
                    self._early = (deps, closure, dirs)

    def closed_artifact(self, data: bytes, tool_reads: Mapping[str, tuple[str, ...]] | None) -> None:
        """Whatever the compiler read went into these bytes before it closed them: if the
        early closure still holds now, it holds for them, however long the driver takes
        to exit (reads after this close cannot change them)."""
        self._held = None
        # (the tools that made these bytes have all run: a toolchain replaced from now on
        # did not make them. Checked in the driver's exit, off the caller's time)
        with contextlib.suppress(OSError, ValueError, SafejitError):
            self._toolchain_at_close = None
            self._toolchain_at_close = (data, self.parts.backend.toolchain_unchanged(self.spec, self._since))
        early = self._early
        checked = _clock.now()  # (an edit from here on may have been missed by the check)
        if early is None or tool_reads is None or not scan.unchanged(early[1], early[2]):
            return
        with contextlib.suppress(OSError, ValueError, SafejitError):
            closure = scan.merged(early[1], self._tools_closure(tool_reads))
            # If these bytes are the build's, so is this manifest (the compile's time:
            # until its artifact was complete).
            products = None if closure.too_new else self.parts.backend.products(data)
            manifest = None if products is None else self._manifest(closure, data, products, self._elapsed())
            self._held = _Held(early[1], data, tool_reads, closure, manifest, checked, early[2])
            if self._on_artifact is not None:  # staged once all it was made of is known to be confined
                self._on_artifact(data, manifest)

    def looked(self, data: bytes) -> None:
        """A program that records its lookups closed the records (a preprocessor has
        exited; the assembler and linker may run on): read them now and walk what they
        name, off the caller's time. The check after the compile decides; this one only
        leaves it less to read and walk."""
        records = self._records
        if records is not None:
            with contextlib.suppress(ValueError, OSError):  # (LookupsLost too: told after)
                records.feed(data)
                self._outside_check().first(records.found(killed=True))

    # -- the job ---------------------------------------------------------------
    def run(self, workdir: str) -> Built:
        """Compile in ``workdir`` and record the closure."""
        self._started_ns, self._started, self._since = time.time_ns(), time.perf_counter(), _clock.now()
        self._toolchain_at_close = None
        out = self._compile(workdir, events=True)
        self._refuse_outside()
        closure, manifest, checked, dirs = self._closure_of(out)
        recorded = self._recorded(closure)
        if recorded is not closure:  # (what the early check vouched for is not all of it)
            closure, manifest, dirs = recorded, None, None
        if closure.too_new:
            # A dependency changed within a clock tick of the compile: what the compiler read
            # is unknown. Once the tick has passed, compile again; vouch only for a clean run.
            logger.info("%s changed while %s compiled; compiling again", closure.too_new[0], self.spec.name)
            time.sleep(scan.COARSE_NS / 1e9)
            self._started_ns = time.time_ns()
            out = self._compile(workdir, events=False)
            self._refuse_outside()
            checked = _clock.now()
            closure = scan.merged(self._closure(out.deps, absent=out.absent), self._tools_closure(out.tool_reads))
            closure = self._recorded(closure)
            manifest, dirs = None, None
        # The staleness clock starts when the check that vouches for the closure began,
        # however long the driver then took to exit or the manifest to be made (DESIGN §6).
        if manifest is None:
            manifest = self._manifest(closure, out.artifact, (out.kernels, out.meta), out.seconds)
        if dirs is None:
            dirs = scan.negative_dirs(closure.negative_paths) or []
        negatives = Negatives(paths=closure.negative_paths, dirs=dirs)
        leaf = VerifiedLeaf("", "", manifest, out.artifact, tuple(closure.states), negatives, checked=checked)
        if out.complete and not closure.too_new and not closure.unsure:
            at_close = self._toolchain_at_close
            return Built(leaf, True, at_close[1] if at_close is not None and at_close[0] is out.artifact else None)
        # What the compiler read is not what was hashed (or is unknown): the build may be
        # returned once, but nothing may vouch for it later — not the disk tier, and not the
        # memory tier (its entry fails its first revalidation).
        changed = set(closure.too_new)
        unvouched = tuple((p, snap, "" if p in changed else d) for p, snap, d in closure.states)
        why = (
            f"{closure.too_new[0]} changed during compile"
            if closure.too_new
            else closure.unsure[0]
            if closure.unsure
            else "the dependency scan is incomplete"
        )
        logger.warning("not caching %s: %s; it will be rebuilt next time", self.spec.name, why)
        self.counters.outcome(Outcome.SKIPPED)
        instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: Outcome.SKIPPED})
        return Built(dataclasses.replace(leaf, dep_states=unvouched, closure_known=out.complete), False)

    def _closure_of(
        self, out: CompileOutput
    ) -> tuple[Closure, Manifest | None, float, list[tuple[str, Snapshot]] | None]:
        """The closure of the finished compile: the one checked at the close that made
        these very bytes, when there was one; else scanned now. With the manifest made
        for those bytes (None: not made yet), when the check that vouches began, and
        the directories that vouch for its negatives (None: not recorded yet)."""
        held = self._held
        early = self._early
        if (
            held is not None
            and early is not None
            and early[0] == out.deps
            and held.listed is early[1]
            and held.artifact is out.artifact
            and held.tool_reads == out.tool_reads
        ):
            manifest = held.manifest
            if manifest is not None and (manifest.kernels, manifest.meta) != (out.kernels, backend_meta(out.meta)):
                manifest = None
            return held.closure, manifest, held.checked, held.dirs
        checked = _clock.now()
        if early is not None and early[0] == out.deps and scan.unchanged(early[1], early[2]):
            return scan.merged(early[1], self._tools_closure(out.tool_reads)), None, checked, early[2]
        checked = _clock.now()
        closure = self._closure(out.deps, absent=out.absent)
        return scan.merged(closure, self._tools_closure(out.tool_reads)), None, checked, None

    def _recorded(self, closure: Closure) -> Closure:
        """``closure`` and what the compile's preprocessors were recorded looking up that
        it misses (``completeness.with_recorded_lookups``); itself when nothing is."""
        if isinstance(self._looked, str):
            return scan.merged(closure, Closure([], [], [], [], [], (self._looked,)))
        if not self._looked:
            return closure
        recorded = completeness.with_recorded_lookups(
            closure,
            self._looked,
            self.anchors,
            started_ns=self._started_ns,
            trust_stat=self.config.trust_stat,
        )
        refused = self._records.refused() if self._records is not None else []
        refused = [p for p in refused if p not in completeness.OWN_LOOKUPS]  # (cicc's, whatever it builds)
        if refused:  # (inside the roots: outside, the build was refused before)
            # The compiler was handed a file it may not read (its mode) as not there, and
            # searched on: whether it may read it is no part of any key, so no leaf can
            # hold what it found.
            why = f"the compiler may not read {refused[0]}, which it took for not there"
            return scan.merged(recorded, Closure([], [], [], [], [], (why,)))
        return recorded

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started

    def _manifest(self, closure: Closure, data: bytes, products: Products, seconds: float) -> Manifest:
        ext = self.parts.backend.artifact_ext
        return make_manifest(self.spec, self.key, closure, ext, artifact=data, products=products, seconds=seconds)

    def _compile(self, workdir: str, *, events: bool) -> CompileOutput:
        self.counters.add("compiles")
        spec, anchors = self.spec, self.anchors
        # The preprocessors record their lookups where they can (sandbox.lookups), into a
        # file in the work dir: none from an earlier run may stand in for this one's. (Those
        # under the source roots complete the closure; one outside every root refuses it.)
        recording = bool(workdir) and bool(self.parts.sandbox.preload_env())
        self._looked, self._workdir, self._check = None, workdir, None
        self._records = (
            lookups.Records(workdir, completeness.lookups_limit(self.config.max_deps)) if recording else None
        )
        preloaded: set[str] = set()  # (the dirs of the runs the recorder was preloaded into)
        if recording:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(workdir, lookups.PRELOAD_FILE))
        with span(SPAN.COMPILER_RUN, {ATTR.SANDBOX: self.parts.sandbox.describe()}) as s:
            ctx = CompileContext(
                spec=spec,
                workdir=workdir,
                expand=anchors.expand_text,
                run=self.parts.runner(
                    self.config,
                    (*spec.toolchain.roots, *spec.toolchain.link_roots),
                    on_start=self.started,
                    record=recording,
                    on_recorded=preloaded.add,
                ),
                timeout=self.config.compile_timeout_s,
                search_dirs=self._search_dirs,
                confine=lambda path: root_policy.confine(path, anchors, what="header"),
                max_deps=self.config.max_deps,
                max_artifact_bytes=self.config.max_artifact_bytes,
                events=self if events else None,
                read_roots=[r for name, r in anchors.roots.items() if not name.startswith(LINK_ANCHOR)],
            )
            began = time.perf_counter()
            try:
                out = self.parts.backend.compile(ctx)
            except CompileError as exc:
                self.counters.add("errors")
                s.add_event("compiler.log", {"safejit.log": exc.log[:LOG_EVENT_CAP]})
                # (a failed run, a timeout above all, took compiler time too: on the dashboards,
                # told apart by its error.type)
                self._record_failed_run(began, exc)
                if recording and self._looked_outside(workdir, killed=isinstance(exc, CompileTimeout)):
                    # Refused as a build that went on is: a file there stopped the compiler
                    # (Landlock), one not there may have too (its error said it was missing),
                    # or let it run on to its time limit.
                    instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: "UndeclaredDependencyError"})
                    raise UndeclaredDependencyError(LOOKED_OUTSIDE) from None
                raise
            except (PolicyError, LimitExceededError) as exc:  # (what it made is refused: LoadTimeCodeError, too large)
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                self._record_failed_run(began, exc)
                raise
            finally:
                self.started()  # (a compile that failed before starting its process)
            s.set_attribute(ATTR.BYTES, len(out.artifact))
            if out.walls is not None:  # (NVRTC: its worker's walls, not the sandbox's runs')
                s.set_attribute(ATTR.SANDBOX, out.walls)
            if out.log:
                s.add_event("compiler.log", {"safejit.log": out.log[:LOG_EVENT_CAP]})
        if recording:
            # (none from a compiler run it was preloaded into: the recorder not installed, a
            # preprocessor not known for one — what it looked up is unknown, as when lost.
            # None from a backend that ran no process there, NVRTC's worker: nothing to add)
            try:
                looked = lookups.read_preloaded(workdir, early=self._records)
                self._looked = (
                    "no preprocessor of the compile recorded its lookups"
                    if looked is None and workdir in preloaded
                    else looked
                )
            except lookups.TooManyLookups as exc:
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: LimitExceededError.__name__})
                raise _too_many_looked(exc) from None
            except lookups.LookupsLost:
                # (so many that the rest went unrecorded: one outside the roots may be among
                # them, which a build returned would tell by its value, or by being returned)
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: "UndeclaredDependencyError"})
                raise _lost() from None
            except ValueError as exc:  # (cut short: what they hid is unknown, the build unvouched)
                self._looked = str(exc)
        instruments.compile_duration.record(out.seconds, self._attrs)
        self.counters.compile_seconds.append(out.seconds)
        if len(out.artifact) > self.config.max_artifact_bytes:
            instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: LimitExceededError.__name__})
            raise LimitExceededError(
                f"artifact is {len(out.artifact)} bytes; the limit is {self.config.max_artifact_bytes}",
                limit=self.config.max_artifact_bytes,
            )
        return out

    def _looked_outside(self, workdir: str, *, killed: bool) -> bool:
        """Whether the failed compile's preprocessors (or assembler) looked up a path
        outside every root, other than the compiler's own (``completeness.first_lookup_outside``):
        those that finished and those cut short (``killed``: at the time limit), each
        lookup written down before the program saw its result."""
        try:
            looked = lookups.read_preloaded(workdir, killed=True, early=self._records)
        except lookups.TooManyLookups as exc:
            instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: LimitExceededError.__name__})
            raise _too_many_looked(exc) from None
        except lookups.LookupsLost:
            raise _lost() from None
        except ValueError as exc:  # (malformed: what they looked up is unknown)
            if killed:  # (what it said before its kill may rest on a lookup outside: not told)
                raise CompileTimeout(
                    f"{self.spec.name}: the compiler ran past {self.config.compile_timeout_s:g}s and was "
                    "killed (its output is withheld: what it looked up is unknown)",
                    log="",
                    timeout=self.config.compile_timeout_s,
                ) from None
            logger.debug("%s: the failed compile's lookups are unknown: %s", self.spec.name, exc)
            return False
        return bool(looked) and self._outside(looked or ())

    def _refuse_outside(self) -> None:
        """Refuse the finished compile whose recorded lookups left the roots, before its
        closure is made (whose own refusal of a file read outside names it)."""
        if isinstance(self._looked, tuple) and self._outside(self._looked):
            instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: "UndeclaredDependencyError"})
            raise UndeclaredDependencyError(LOOKED_OUTSIDE)

    def _outside_check(self) -> completeness.OutsideCheck:
        if self._check is None:
            self._check = completeness.OutsideCheck(
                self.anchors, spelled=self.spec.toolchain.spelled_dirs, workdir=self._workdir
            )
        return self._check

    def _outside(self, looked: Sequence[tuple[str, bool | None]]) -> bool:
        found = self._outside_check().first(looked)
        if found:
            logger.debug("%s: refused: the compiler looked up %r, outside every root", self.spec.name, found)
        return found is not None

    def _record_failed_run(self, began: float, exc: Exception) -> None:
        attrs = {**self._attrs, ATTR.ERROR_TYPE: type(exc).__name__}
        instruments.compile_duration.record(time.perf_counter() - began, attrs)

    def _tools_closure(self, reads: Mapping[str, tuple[str, ...]]) -> Closure:
        """The closure of what each other tool read: the assembler's (what inline asm
        names) confined like includes, the linker's also under the linker's roots."""
        closure = _NO_CLOSURE
        for tool, deps in reads.items():
            if deps:
                closure = scan.merged(closure, self._closure(deps, tools=True, linker=tool == "linker"))
        return closure

    def _closure(
        self,
        deps: Sequence[str],
        *,
        early: bool = False,
        tools: bool = False,
        linker: bool = False,
        absent: Sequence[str] | None = None,
    ) -> Closure:
        """The closure of ``deps``, confined and hashed. ``early``: a scan while the
        compiler still runs, which a later one may repeat (its violations are not
        counted). ``tools``: files the assembler or linker read (no includes, no
        negatives); ``linker``: the linker's (which may also lie under its roots);
        ``absent``: the compiler's recorded failed lookups (``CompileOutput.absent``)."""
        with span(SPAN.POLICY_CHECK, {ATTR.KIND: "completeness"}) as s:
            try:
                return completeness.record_closure(
                    deps,
                    self.anchors,
                    max_deps=self.config.max_deps,
                    started_ns=self._started_ns,
                    search_dirs=() if tools else self._search_dirs,
                    source=b"" if tools else _as_scanned(self.spec),
                    trust_stat=self.config.trust_stat,
                    includes=not tools,
                    linker=linker,
                    absent=absent,
                    spelled=self.spec.toolchain.spelled_dirs,
                    ours=os.path.dirname(self._workdir) if self._workdir else None,
                )
            except (PolicyError, LimitExceededError) as exc:
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                if not early:
                    instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                raise
            except OSError as exc:  # (a listed file that is no regular file, or unreadable)
                raise CompileError(
                    f"{self.spec.name}: a file the build read cannot be hashed: {exc.filename}: {exc.strerror}",
                    log="",
                ) from None


def _as_scanned(spec: BuildSpec) -> bytes:
    """The source as what it probes is read: its macros first (``-D`` flags, then
    ``defines=``, as every backend orders them), as the ``#define`` lines the compiler
    reads them as (``-DHAS_X=__has_include(<x.h>)`` probes)."""
    lines = []
    for flag in spec.flags:
        if flag.startswith("-D"):  # (checked: -DNAME or -DNAME=VALUE, one item)
            name, eq, value = flag[2:].partition("=")
            lines.append(f"#define {name} {value if eq else '1'}".encode())
    lines += [f"#define {name} {'' if value is None else value}".encode() for name, value in spec.defines]
    return b"\n".join([*lines, spec.code]) if lines else spec.code


def _too_many_looked(exc: lookups.TooManyLookups) -> LimitExceededError:
    # (refused whatever the paths were: one outside the roots among those not walked is
    # refused as well)
    return LimitExceededError(
        f"the compiler looked up {exc}; the limit is {exc.limit} ({completeness.LIMIT_SAID})",
        limit=exc.limit,
    )


def _lost() -> UndeclaredDependencyError:
    # (the words of a lookup outside: a source that floods the records in one branch only
    # would otherwise read which branch it took from the message)
    logger.debug("refused: the compiler looked up more paths than can be recorded")
    return UndeclaredDependencyError(LOOKED_OUTSIDE)
