"""Runtime: the one place that composes the layers (DESIGN.md §1).

    compile → resolve → confine → memory → build_key → disk → lock → compile
            → check closure → publish → load

This module is longer than the house limit because it *is* the data path;
each step is a short method named after it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _env
from .backends import Backend, get_backend
from .backends.base import CompileOutput, RunOutcome
from .cache.disk import LAYOUT, DiskCache, Rejection, VerifiedLeaf
from .cache.manifest import Manifest
from .cache.memory import Entry, MemoryCache
from .cache.statmemo import StatMemo
from .cache.usage import MAX_SAMPLES, usage_name, write_usage
from .config import Config
from .deps import Anchors
from .errors import (
    CacheError,
    CompileError,
    ConfigError,
    KeyDeclarationError,
    LimitExceededError,
    LoadError,
    PolicyError,
)
from .inventory import InventoryWriter
from .inventory import Request as InventoryRequest
from .kernel import Artifact, Module
from .keys import KEY_SCHEMA, build_key, deps_key, digest_bytes
from .policy import completeness
from .policy import flags as flag_policy
from .policy import roots as root_policy
from .policy.completeness import Closure
from .policy.sandbox import SYSTEM_PATH, Sandbox
from .policy.trust import HmacSigner
from .spec import BuildSpec, Source, Toolchain
from .telemetry import ATTR, SPAN, instruments, span

__all__ = ["Explanation", "Runtime"]

logger = logging.getLogger(__name__)

Request = tuple[Any, ...]
_LOG_EVENT_CAP = 8192


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a lookup would hit or miss; ``path`` names the first changed dependency."""

    result: str  # "hit" | "miss"
    reason: str
    build_key: str
    path: str | None = None
    leaf: str | None = None

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.result}: {self.reason}{where} [build {self.build_key[:16]}]"


class _State:
    """What the first compile sets up: backend, sandbox, disk tier."""

    def __init__(self, config: Config) -> None:
        dirs = config.resolved_cache_dirs()
        self.disk = DiskCache(
            dirs,
            tenant=config.tenant,
            backend=config.backend,
            signer=HmacSigner(config.signing_key) if config.signing_key else None,
            require_signed=config.require_signed,
            max_artifact_bytes=config.max_artifact_bytes,
        )
        root = self.disk.writable_root()
        self.tools_dir = os.path.join(root, LAYOUT, "tools") if root else None
        # The shim is built by the system compiler, never by a configured one: a
        # configured compiler is what the sandbox is there to contain.
        cc = shutil.which("cc", path=SYSTEM_PATH)
        self.sandbox = Sandbox(config.sandbox, tools_dir=self.tools_dir, cc=cc)
        self.sandbox.check_available()
        private = self._private_state_dir()
        if private is not None and config.trust_stat:
            self.disk.stat_memo = StatMemo(private)
        self.backend: Backend = get_backend(config.backend, cc=config.host_cc, cxx=config.host_cxx, state_dir=private)
        self._probe_dir: str | None = None
        self._anchors: dict[Toolchain, Anchors] = {}
        self.source_roots = config.source_roots

    def _private_state_dir(self) -> str | None:
        if not self.tools_dir:
            return None
        path = os.path.join(self.tools_dir, f"u{os.geteuid()}")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError:
            return None
        return path if st.st_uid == os.geteuid() and not st.st_mode & 0o022 else None

    @property
    def probe_dir(self) -> str:
        """A scratch directory for toolchain probes, made on first need."""
        if self._probe_dir is None:
            self._probe_dir = tempfile.mkdtemp(prefix="safejit-probe-")
        return self._probe_dir

    def anchors(self, toolchain: Toolchain) -> Anchors:
        found = self._anchors.get(toolchain)
        if found is None:
            found = root_policy.build_anchors(self.source_roots, toolchain.roots)
            self._anchors[toolchain] = found
        return found

    def close(self) -> None:
        if self._probe_dir is not None:
            shutil.rmtree(self._probe_dir, ignore_errors=True)


class Runtime:
    """Compiles, caches, loads. Lazy: nothing is touched until the first compile.

    >>> rt = Runtime()                                     # doctest: +SKIP
    >>> mod = rt.compile(Source("int add(int a,int b){return a+b;}", "add"))  # doctest: +SKIP
    >>> mod.kernel("add")(2, 3)                            # doctest: +SKIP
    5
    """

    def __init__(self, backend: str | None = None, *, config: Config | None = None) -> None:
        cfg = config if config is not None else Config.from_env()
        if backend is not None and backend != cfg.backend:
            cfg = cfg.replace(backend=backend)
        self.config = cfg
        self._env = _env.passthrough_values(cfg.env_passthrough)
        self._state: _State | None = None
        self._init_lock = threading.Lock()
        self._staleness = cfg.max_staleness_s
        self._fast = not cfg.trace_memory_hits
        self._memory: MemoryCache[Module] = MemoryCache(
            max_entries=cfg.memory_max_entries,
            max_bytes=cfg.memory_max_bytes,
            max_staleness_s=cfg.max_staleness_s,
            on_evict=self._evicted,
        )
        self._entries = self._memory.entries
        self._memory_hits = 0
        self._counts = dict.fromkeys(
            ("compiles", "disk_hits", "misses", "stale", "bypass", "published", "adopted", "not_published", "errors"), 0
        )
        self._count_lock = threading.Lock()
        self._compile_seconds: deque[float] = deque(maxlen=MAX_SAMPLES)
        self._usage_name = usage_name()
        self._inventory = InventoryWriter(cfg.inventory) if cfg.inventory else None
        self._attrs = {ATTR.BACKEND: cfg.backend, ATTR.TENANT: cfg.tenant}
        self._closed = False
        ref = weakref.ref(self)

        def observe() -> list[tuple[int, int, int, dict[str, str]]]:
            rt = ref()
            return [] if rt is None else [(rt._memory_hits, len(rt._memory), rt._memory.bytes, rt._attrs)]

        self._observer = observe
        instruments.register(observe)
        weakref.finalize(self, instruments.unregister, observe)
        atexit.register(_flush_at_exit, ref)

    # -- public API ----------------------------------------------------------
    def compile(
        self,
        source: Source,
        *,
        include_dirs: Sequence[str] = (),
        defines: Mapping[str, Any] | None = None,
        flags: Sequence[str] = (),
        extras: Mapping[str, Any] | None = None,
        arch: str | None = None,
    ) -> Module:
        """Compile (or find) ``source`` and return its loaded :class:`Module`. Thread-safe."""
        req = (
            source,
            tuple(include_dirs),
            tuple(defines.items()) if defines else (),
            tuple(flags),
            tuple(extras.items()) if extras else (),
            arch,
        )
        try:
            entry = self._entries.get(req)
        except TypeError:
            raise ConfigError("defines and extras values must be str, int, float or bool") from None
        if entry is not None and self._fast and time.monotonic() - entry.checked < self._staleness:
            entry.ref = True
            self._memory_hits += 1
            return entry.value
        return self._compile_slow(req, entry)

    def build(
        self,
        source: Source,
        *,
        include_dirs: Sequence[str] = (),
        defines: Mapping[str, Any] | None = None,
        flags: Sequence[str] = (),
        extras: Mapping[str, Any] | None = None,
        arch: str | None = None,
    ) -> Artifact:
        """Compile and cache ``source`` without loading it."""
        req = (
            source,
            tuple(include_dirs),
            tuple(defines.items()) if defines else (),
            tuple(flags),
            tuple(extras.items()) if extras else (),
            arch,
        )
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: _name_of(source)}):
            spec, key, anchors = self._resolve(req)
            leaf, where = self._obtain(spec, key, anchors)
            return _artifact(leaf, where)

    def source(self, path: str | os.PathLike[str], *, name: str | None = None) -> Source:
        """Read a source file *after* confining it to the declared source roots."""
        anchors = root_policy.build_anchors(self.config.source_roots, ())
        real = root_policy.confine(os.fspath(path), anchors, what="source file")
        return Source.from_file(real, name=name, max_bytes=self.config.max_source_bytes)

    def warm(self, request: InventoryRequest) -> str:
        """Build one inventory request unless it already verifies: ``hit``, ``built``
        or ``skipped`` (a root it names is not declared here)."""
        d = request.data
        probe = Source(d["code"], d["name"], filename=d["filename"])
        state = self._init()
        anchors = state.anchors(state.backend.toolchain(probe, self._runner(state)))
        args = request.arguments(anchors)
        if args is None:
            return "skipped"
        source = args.pop("source")
        if self.explain(source, **args).result == "hit":
            return "hit"
        self.build(source, **args)
        return "built"

    def stats(self) -> Mapping[str, int]:
        with self._count_lock:
            out = dict(self._counts)
        out["memory_hits"] = self._memory_hits
        out["evictions"] = self._memory.evictions
        out["memory_entries"] = len(self._memory)
        out["memory_bytes"] = self._memory.bytes
        return out

    def explain(
        self,
        source: Source,
        *,
        include_dirs: Sequence[str] = (),
        defines: Mapping[str, Any] | None = None,
        flags: Sequence[str] = (),
        extras: Mapping[str, Any] | None = None,
        arch: str | None = None,
    ) -> Explanation:
        """Say whether a compile would hit the disk tier and, if not, why."""
        req = (
            source,
            tuple(include_dirs),
            tuple(defines.items()) if defines else (),
            tuple(flags),
            tuple(extras.items()) if extras else (),
            arch,
        )
        _, key, anchors = self._resolve(req)
        disk = self._init().disk
        first: Rejection | None = None
        for root in disk.roots:
            for leaf in disk.candidates(root, key):
                result = disk.verify(leaf, root, key, anchors)
                if isinstance(result, VerifiedLeaf):
                    return Explanation("hit", "a leaf verifies", key, leaf=leaf)
                first = first or result
        if first is None:
            return Explanation("miss", "never built with these inputs (no leaf for this build key)", key)
        return Explanation(
            "miss", _REASON_TEXT.get(first.reason, first.reason), key, path=first.detail, leaf=first.leaf
        )

    def close(self) -> None:
        """Unload every cached module and release resources. Safe to call twice."""
        if not self._closed:
            self.flush_usage()
        self._closed = True
        for entry in self._memory.clear():
            entry.value.close()
        instruments.unregister(self._observer)
        if self._state is not None:
            self._state.close()

    def flush_usage(self) -> None:
        """Write this process's counters into the cache root for ``safejit stats``."""
        state = self._state
        if state is None:
            return
        root = state.disk.writable_root()
        stats = self.stats()
        if root is None or not any(stats[k] for k in ("compiles", "memory_hits", "disk_hits", "misses")):
            return
        write_usage(root, self.config.tenant, self._usage_name, self.config.backend, stats, self._compile_seconds)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the data path -------------------------------------------------------
    def _compile_slow(self, req: Request, entry: Entry[Module] | None) -> Module:
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: _name_of(req[0])}) as root_span:
            if entry is not None:
                with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: "memory"}) as s:
                    fresh = self._memory.fresh(entry, time.monotonic())
                    result = "hit" if fresh else "miss"
                    reason = "revalidated" if fresh and not self._fast else ("revalidated" if fresh else "stale")
                    s.set_attributes({ATTR.RESULT: result, ATTR.REASON: reason})
                _lookup_metric("memory", result, reason, self._attrs)
                if fresh:
                    entry.ref = True
                    self._memory_hits += 1
                    root_span.set_attribute(ATTR.TIER, "memory")
                    return entry.value
                self._memory.discard(req, entry)
                self._count("stale")
                logger.info("memory entry for %s is stale; looking again", _name_of(req[0]))
            else:
                with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: "memory", ATTR.RESULT: "miss", ATTR.REASON: "absent"}):
                    pass
                _lookup_metric("memory", "miss", "absent", self._attrs)
            produced, _ = self._memory.single_flight(req, lambda: self._produce(req))
            root_span.set_attribute(ATTR.TIER, produced.value.artifact.source)
            return produced.value

    def _produce(self, req: Request) -> Entry[Module]:
        spec, key, anchors = self._resolve(req)
        if self._inventory is not None:
            self._inventory.record(spec, self.config.backend)
        leaf, where = self._obtain(spec, key, anchors)
        artifact = _artifact(leaf, where)
        state = self._init()
        with span(SPAN.LOAD, {ATTR.BYTES: len(leaf.artifact)}):
            started = time.perf_counter()
            try:
                library = state.backend.load(leaf.artifact, name=spec.name)
            except OSError as exc:
                raise LoadError(f"{spec.name}: loading the verified artifact failed: {exc}", name=spec.name) from exc
            instruments.load_duration.record(time.perf_counter() - started, self._attrs)
        module = Module(library, artifact, self.config.backend)
        return Entry(
            module, len(leaf.artifact), Entry.dep_list(leaf.dep_states), time.monotonic(), negatives=leaf.negatives
        )

    def _init(self) -> _State:
        state = self._state
        if state is None:
            with self._init_lock:
                if self._state is None:
                    self._state = _State(self.config)
                state = self._state
        return state

    def _resolve(self, req: Request) -> tuple[BuildSpec, str, Anchors]:
        """Request → BuildSpec (confined, policy-checked) and its build key."""
        source, include_dirs, defines, flags, extras, arch = req
        state = self._init()
        with span(SPAN.POLICY_CHECK) as s:
            try:
                spec, anchors = self._make_spec(state, source, include_dirs, defines, flags, extras, arch)
            except (PolicyError, LimitExceededError, KeyDeclarationError) as exc:
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                raise
        with span(SPAN.KEY) as s:
            key = build_key(spec)
            s.set_attribute(ATTR.BUILD_KEY, key)
        return spec, key, anchors

    def _make_spec(
        self,
        state: _State,
        source: Any,
        include_dirs: tuple[Any, ...],
        defines: tuple[Any, ...],
        flags: tuple[Any, ...],
        extras: tuple[Any, ...],
        arch: str | None,
    ) -> tuple[BuildSpec, Anchors]:
        cfg = self.config
        if not isinstance(source, Source):
            raise ConfigError(f"source must be a safejit.Source, got {type(source).__name__}")
        if any(not isinstance(d, (str, os.PathLike)) for d in include_dirs):
            raise ConfigError("include_dirs must be a sequence of paths")
        code = source.code.encode("utf-8")
        if len(code) > cfg.max_source_bytes:
            raise LimitExceededError(
                f"source {source.name} is {len(code)} bytes; the limit is {cfg.max_source_bytes}",
                limit=cfg.max_source_bytes,
            )
        names, declared = {k for k, _ in extras}, set(cfg.declared_extras)
        if names != declared:
            raise KeyDeclarationError(
                f"extras must name exactly {sorted(declared)}; "
                f"missing {sorted(declared - names)}, unknown {sorted(names - declared)}"
            )
        extra_values = tuple(sorted((k, _extra_text(k, v)) for k, v in extras))
        backend = state.backend
        toolchain = backend.toolchain(source, self._runner(state))
        anchors = state.anchors(toolchain)

        def anchored(path: Any, what: str) -> tuple[str, str]:
            real = root_policy.confine(os.fspath(path), anchors, what=what)
            found = anchors.anchor(real)
            assert found is not None
            return found

        def token(path: str, what: str) -> str:
            return Anchors.token(*anchored(path, what))

        incs = tuple(anchored(d, "include dir") for d in include_dirs)
        quote = None
        if source.origin is not None:
            origin = anchored(source.origin, "source file")
            quote = anchored(os.path.dirname(anchors.expand(*origin) or ""), "source directory")
        checked_flags = flag_policy.check_flags(flags, token)
        checked_defines = flag_policy.check_defines(dict(defines))
        language = backend.language(source)
        argv = backend.argv(
            toolchain=toolchain,
            language=language,
            flags=checked_flags,
            defines=checked_defines,
            include_dirs=[Anchors.token(*a) for a in incs],
            quote_dir=Anchors.token(*quote) if quote else None,
            arch=arch,
        )
        spec = BuildSpec(
            schema=KEY_SCHEMA,
            backend=f"{backend.name}/{backend.abi}",
            tenant=cfg.tenant,
            toolchain=toolchain,
            name=source.name,
            language=language,
            filename=source.staged_filename(".cpp" if language == "c++" else ".c"),
            source_digest=digest_bytes(code),
            code=code,
            include_dirs=incs,
            quote_dir=quote,
            defines=checked_defines,
            flags=checked_flags,
            extras=extra_values,
            env=self._env,
            arch=arch,
            argv=argv,
        )
        return spec, anchors

    def _obtain(self, spec: BuildSpec, key: str, anchors: Anchors) -> tuple[VerifiedLeaf, str]:
        """A verified leaf for ``key``: from disk, or compiled and published."""
        state = self._init()
        leaf = self._disk_lookup(state.disk, key, anchors, spec.name)
        if leaf is not None:
            self._count("disk_hits")
            return leaf, "disk"
        self._count("misses")
        root = state.disk.writable_root()
        if root is None:
            return self._bypass(state, spec, key, anchors, "no writable cache root")
        with span(SPAN.LOCK_WAIT, {ATTR.ROOT: root}) as s:
            started = time.perf_counter()
            lock = state.disk.acquire_lock(root, key, self.config.lock_timeout_s)
            waited = time.perf_counter() - started
            s.set_attribute(ATTR.RESULT, "acquired" if lock is not None else "timeout")
            instruments.lock_wait_duration.record(waited, self._attrs)
        try:
            if lock is not None:
                # Look again under the lock: another process may have just published it.
                leaf = self._disk_lookup(state.disk, key, anchors, spec.name)
                if leaf is not None:
                    self._count("disk_hits")
                    return leaf, "disk"
            return self._compile_and_publish(state, spec, key, anchors, root)
        finally:
            if lock is not None:
                lock.release()

    def _disk_lookup(self, disk: DiskCache, key: str, anchors: Anchors, name: str) -> VerifiedLeaf | None:
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
                    _lookup_metric("disk", "reject", rej.reason, self._attrs)
                if leaf is not None:
                    s.set_attributes(
                        {
                            ATTR.RESULT: "hit",
                            ATTR.DEPS_KEY: leaf.manifest.deps_key,
                            ATTR.DEPS_COUNT: len(leaf.manifest.deps),
                        }
                    )
                    _lookup_metric("disk", "hit", "verified", self._attrs)
                    return leaf
                reason = rejections[-1].reason if len(rejections) > before else "absent"
                s.set_attributes({ATTR.RESULT: "miss", ATTR.REASON: reason})
                _lookup_metric("disk", "miss", reason, self._attrs)
        if rejections:
            first = rejections[0]
            logger.info("rebuilding %s: %s (%s)", name, _REASON_TEXT.get(first.reason, first.reason), first.detail)
        return None

    def _runner(self, state: _State) -> Any:
        env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", **dict(self._env)}
        roots = list(self.config.source_roots)

        def run(
            argv: Sequence[str], *, cwd: str, timeout: float | None = None, extra_read: Sequence[str] = ()
        ) -> RunOutcome:
            where = cwd or state.probe_dir
            tmp = os.path.join(where, ".tmp")
            os.makedirs(tmp, exist_ok=True)
            return state.sandbox.run(
                argv,
                cwd=where,
                env={**env, "TMPDIR": tmp},
                timeout=timeout or self.config.compile_timeout_s,
                read_roots=[*roots, *extra_read],
                write_roots=[where],
            )

        return run

    def _compile(self, state: _State, spec: BuildSpec, anchors: Anchors, workdir: str) -> CompileOutput:
        self._count("compiles")
        with span(SPAN.COMPILER_RUN, {ATTR.SANDBOX: state.sandbox.describe()}) as s:
            try:
                out = state.backend.compile(
                    spec,
                    workdir=workdir,
                    expand=anchors.expand_text,
                    run=self._runner(state),
                    timeout=self.config.compile_timeout_s,
                )
            except CompileError as exc:
                self._count("errors")
                s.add_event("compiler.log", {"safejit.log": exc.log[:_LOG_EVENT_CAP]})
                raise
            s.set_attribute(ATTR.BYTES, len(out.artifact))
            if out.log:
                s.add_event("compiler.log", {"safejit.log": out.log[:_LOG_EVENT_CAP]})
        instruments.compile_duration.record(out.seconds, self._attrs)
        self._compile_seconds.append(out.seconds)
        if len(out.artifact) > self.config.max_artifact_bytes:
            raise LimitExceededError(
                f"artifact is {len(out.artifact)} bytes; the limit is {self.config.max_artifact_bytes}",
                limit=self.config.max_artifact_bytes,
            )
        return out

    def _compile_and_publish(
        self, state: _State, spec: BuildSpec, key: str, anchors: Anchors, root: str
    ) -> tuple[VerifiedLeaf, str]:
        try:
            workdir = state.disk.new_workdir(root)
        except OSError as exc:
            return self._cache_failure(state, spec, key, anchors, exc)
        try:
            started_ns = time.time_ns()
            out = self._compile(state, spec, anchors, workdir)
            closure = self._closure(spec, anchors, out, started_ns)
            too_new, deps, states = closure.too_new, closure.deps, closure.states
            manifest = _manifest(spec, key, closure, out, self.config, state.backend.artifact_ext)
            leaf = VerifiedLeaf("", root, manifest, out.artifact, tuple(states), tuple(closure.negative_paths))
            if not out.complete or too_new:
                why = f"{too_new[0]} changed during compile" if too_new else "the dependency scan is incomplete"
                logger.warning("not publishing %s: %s; it will be rebuilt next time", spec.name, why)
                self._count("not_published")
                instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: "skipped"})
                return leaf, "compiled"
            with span(SPAN.PUBLISH, {ATTR.DEPS_KEY: manifest.deps_key, ATTR.DEPS_COUNT: len(deps)}) as s:
                try:
                    leaf, outcome = state.disk.publish(
                        root, key, manifest, out.artifact, tuple(states), tuple(closure.negative_paths)
                    )
                except OSError as exc:
                    s.set_attribute(ATTR.OUTCOME, "failed")
                    instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: "failed"})
                    if self.config.on_cache_error == "raise":
                        raise CacheError(f"publishing {spec.name} failed: {exc}", path=root, errno=exc.errno) from exc
                    self._note_bypass(f"publish failed: {exc}")
                    return leaf, "bypass"
                s.set_attribute(ATTR.OUTCOME, outcome)
            instruments.publish_outcomes.add(1, {**self._attrs, ATTR.OUTCOME: outcome})
            self._count(outcome)
            return leaf, "disk" if outcome == "adopted" else "compiled"
        finally:
            state.disk.discard(workdir, root)

    def _cache_failure(
        self, state: _State, spec: BuildSpec, key: str, anchors: Anchors, exc: OSError
    ) -> tuple[VerifiedLeaf, str]:
        if self.config.on_cache_error == "raise":
            raise CacheError(f"the disk cache cannot be used: {exc}", errno=exc.errno) from exc
        return self._bypass(state, spec, key, anchors, str(exc))

    def _bypass(self, state: _State, spec: BuildSpec, key: str, anchors: Anchors, why: str) -> tuple[VerifiedLeaf, str]:
        if self.config.on_cache_error == "raise":
            raise CacheError(f"the disk cache cannot be used: {why}")
        self._note_bypass(why)
        workdir = tempfile.mkdtemp(prefix="safejit-bypass-")
        try:
            started_ns = time.time_ns()
            out = self._compile(state, spec, anchors, workdir)
            closure = self._closure(spec, anchors, out, started_ns)
            manifest = _manifest(spec, key, closure, out, self.config, state.backend.artifact_ext)
            leaf = VerifiedLeaf("", "", manifest, out.artifact, tuple(closure.states), tuple(closure.negative_paths))
            return leaf, "bypass"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _closure(self, spec: BuildSpec, anchors: Anchors, out: CompileOutput, started_ns: int) -> Closure:
        with span(SPAN.POLICY_CHECK, {ATTR.KIND: "completeness"}) as s:
            try:
                return completeness.record_closure(
                    out.deps,
                    anchors,
                    max_deps=self.config.max_deps,
                    started_ns=started_ns,
                    search_dirs=_search_dirs(spec, anchors),
                    source=spec.code,
                )
            except (PolicyError, LimitExceededError) as exc:
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                raise

    def _note_bypass(self, why: str) -> None:
        logger.warning("safejit cache bypassed: %s; the kernel is compiled privately and not cached", why)
        self._count("bypass")
        instruments.bypass.add(1, self._attrs)

    def _evicted(self, module: Module) -> None:
        # The module stays loaded while callers hold it; the finalizer unloads it after.
        instruments.evictions.add(1, self._attrs)

    def _count(self, name: str) -> None:
        with self._count_lock:
            self._counts[name] += 1


_REASON_TEXT = {
    "dep_changed": "a dependency changed",
    "dep_missing": "a dependency is missing",
    "dep_shadowed": "a new header shadows a dependency",
    "marker": "the leaf is not committed",
    "manifest": "the manifest is damaged",
    "mismatch": "the manifest names another leaf",
    "artifact": "the artifact is missing or damaged",
    "signature": "the leaf is not validly signed",
    "anchor": "a dependency root is not declared here",
    "confinement": "a dependency escapes its root",
}


def _flush_at_exit(ref: weakref.ref[Runtime]) -> None:
    rt = ref()
    if rt is not None and not rt._closed:
        rt.flush_usage()


def _name_of(source: Any) -> str:
    return source.name if isinstance(source, Source) else "?"


def _extra_text(name: str, value: Any) -> str:
    if isinstance(value, (bool, str, int, float)):
        return json.dumps(value)
    raise KeyDeclarationError(f"extra {name} must be str, int, float or bool, got {type(value).__name__}")


def _lookup_metric(tier: str, result: str, reason: str, attrs: Mapping[str, str]) -> None:
    instruments.lookups.add(1, {**attrs, ATTR.TIER: tier, ATTR.RESULT: result, ATTR.REASON: reason})


def _search_dirs(spec: BuildSpec, anchors: Anchors) -> list[str]:
    """The include search list the compiler used, in order (quote chain first)."""

    def from_flags(prefix: str) -> list[str]:
        return [anchors.expand_text(f[len(prefix) :]) for f in spec.flags if f.startswith(prefix)]

    dirs = [anchors.expand(*spec.quote_dir) or ""] if spec.quote_dir else []
    dirs += from_flags("-iquote")
    dirs += [anchors.expand(*d) or "" for d in spec.include_dirs]
    dirs += from_flags("-I") + from_flags("-isystem") + list(spec.toolchain.search_dirs) + from_flags("-idirafter")
    return [d for d in dirs if d]


def _manifest(spec: BuildSpec, key: str, closure: Closure, out: CompileOutput, cfg: Config, ext: str) -> Manifest:
    dep_tuples = tuple(sorted(d.as_tuple() for d in closure.deps))
    negatives = tuple(sorted(closure.negatives))
    return Manifest(
        build_key=key,
        deps_key=deps_key(dep_tuples, negatives),
        backend=cfg.backend,
        tenant=cfg.tenant,
        name=spec.name,
        deps=dep_tuples,
        negatives=negatives,
        artifact_file=f"artifact.{ext}",
        artifact_size=len(out.artifact),
        artifact_digest=digest_bytes(out.artifact),
        kernels=out.kernels,
        argv=spec.argv,
        toolchain={
            "compiler": spec.toolchain.compiler,
            "version": spec.toolchain.version,
            "digest": spec.toolchain.digest,
        },
        timings={"compile_s": round(out.seconds, 6)},
        created=time.time(),
    )


def _artifact(leaf: VerifiedLeaf, where: str) -> Artifact:
    man = leaf.manifest
    return Artifact(
        build_key=man.build_key,
        deps_key=man.deps_key,
        path=leaf.path,
        digest=man.artifact_digest,
        size=man.artifact_size,
        kernels=man.kernels,
        source=where,
    )
