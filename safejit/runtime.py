"""Runtime: the one place that composes the layers (DESIGN.md §1).

    compile → resolve → confine → memory → build_key → disk → lock → compile
            → check closure → publish → load

``Runtime`` owns the public API and the memory tier; ``resolve.Resolver`` turns
a request into a confined BuildSpec and its key; ``builder.Builder`` runs the
disk half (lookup, lock, compile, closure check, publish, bypass); ``setup``
holds what the first compile creates.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from . import _env
from ._pipeline.parts import Setup
from ._pipeline.pipeline import Builder
from ._pipeline.records import REASON_TEXT, Counters, Explanation, artifact_of, lookup_metric, name_of
from ._pipeline.resolve import Request, Resolver
from .cache.disk import Rejection, VerifiedLeaf
from .cache.memory import Entry, MemoryCache
from .cache.usage import usage_name, write_usage
from .config import Config
from .errors import ConfigError, LoadError
from .inventory import InventoryWriter
from .inventory import Request as InventoryRequest
from .kernel import Artifact, Module
from .policy import roots as root_policy
from .spec import Source
from .telemetry import ATTR, SPAN, instruments, span

__all__ = ["Explanation", "Runtime"]

logger = logging.getLogger(__name__)


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
        self._setup: Setup | None = None
        self._parts: tuple[Resolver, Builder] | None = None
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
        self._counters = Counters()
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
        name_expressions: Sequence[str] = (),
    ) -> Module:
        """Compile (or find) ``source`` and return its loaded :class:`Module`. Thread-safe.

        ``name_expressions`` (CUDA, NVRTC) name template instantiations to compile
        and look up by name, e.g. ``("scale<float>",)``.
        """
        req = (
            source,
            tuple(include_dirs),
            tuple((k, v.__class__, v) for k, v in defines.items()) if defines else (),
            tuple(flags),
            tuple((k, v.__class__, v) for k, v in extras.items()) if extras else (),
            arch,
            tuple(name_expressions),
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
        name_expressions: Sequence[str] = (),
    ) -> Artifact:
        """Compile and cache ``source`` without loading it."""
        req = _request(source, include_dirs, defines, flags, extras, arch, name_expressions)
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: name_of(source)}):
            spec, key, anchors = self._resolver().resolve(req)
            leaf, where, _ = self._builder().obtain(spec, key, anchors)
            return artifact_of(leaf, where)

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
        setup = self._init()
        anchors = setup.anchors(setup.backend.toolchain(probe, setup.runner(self.config, self._env)))
        args = request.arguments(anchors)
        if args is None:
            return "skipped"
        source = args.pop("source")
        if self.explain(source, **args).result == "hit":
            return "hit"
        self.build(source, **args)
        return "built"

    def stats(self) -> Mapping[str, int]:
        out = self._counters.snapshot()
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
        name_expressions: Sequence[str] = (),
    ) -> Explanation:
        """Say whether a compile would hit the disk tier and, if not, why."""
        req = _request(source, include_dirs, defines, flags, extras, arch, name_expressions)
        _, key, anchors = self._resolver().resolve(req)
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
        return Explanation("miss", REASON_TEXT.get(first.reason, first.reason), key, path=first.detail, leaf=first.leaf)

    def close(self) -> None:
        """Unload every cached module and release resources. Safe to call twice."""
        if not self._closed:
            self.flush_usage()
        self._closed = True
        for entry in self._memory.clear():
            entry.value.close()
        instruments.unregister(self._observer)
        if self._setup is not None:
            self._setup.close()

    def flush_usage(self) -> None:
        """Write this process's counters into the cache root for ``safejit stats``."""
        setup = self._setup
        if setup is None:
            return
        root = setup.disk.writable_root()
        stats = self.stats()
        if root is None or not any(stats[k] for k in ("compiles", "memory_hits", "disk_hits", "misses")):
            return
        write_usage(
            root, self.config.tenant, self._usage_name, self.config.backend, stats, self._counters.compile_seconds
        )

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the data path -------------------------------------------------------
    def _compile_slow(self, req: Request, entry: Entry[Module] | None) -> Module:
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: name_of(req[0])}) as root_span:
            if entry is not None:
                with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: "memory"}) as s:
                    fresh = self._memory.fresh(entry, time.monotonic())
                    result = "hit" if fresh else "miss"
                    reason = "revalidated" if fresh and not self._fast else ("revalidated" if fresh else "stale")
                    s.set_attributes({ATTR.RESULT: result, ATTR.REASON: reason})
                lookup_metric("memory", result, reason, self._attrs)
                if fresh:
                    entry.ref = True
                    self._memory_hits += 1
                    root_span.set_attribute(ATTR.TIER, "memory")
                    return entry.value
                self._memory.discard(req, entry)
                self._counters.add("stale")
                logger.info("memory entry for %s is stale; looking again", name_of(req[0]))
            else:
                with span(SPAN.MEMORY_LOOKUP, {ATTR.TIER: "memory", ATTR.RESULT: "miss", ATTR.REASON: "absent"}):
                    pass
                lookup_metric("memory", "miss", "absent", self._attrs)
            produced, _ = self._memory.single_flight(req, lambda: self._produce(req))
            root_span.set_attribute(ATTR.TIER, produced.value.artifact.source)
            return produced.value

    def _produce(self, req: Request) -> Entry[Module]:
        spec, key, anchors = self._resolver().resolve(req)
        if self._inventory is not None:
            self._inventory.record(spec, self.config.backend)
        setup = self._init()

        def load(leaf: VerifiedLeaf) -> Any:
            with span(SPAN.LOAD, {ATTR.BYTES: len(leaf.artifact)}):
                started = time.perf_counter()
                try:
                    library = setup.backend.load(leaf.artifact, name=spec.name, options=leaf.manifest.meta)
                except OSError as exc:
                    raise LoadError(
                        f"{spec.name}: loading the verified artifact failed: {exc}", name=spec.name
                    ) from exc
                instruments.load_duration.record(time.perf_counter() - started, self._attrs)
            return library

        leaf, where, library = self._builder().obtain(spec, key, anchors, load)
        module = Module(library, artifact_of(leaf, where), self.config.backend)
        return Entry(
            module,
            len(leaf.artifact),
            Entry.dep_list(leaf.dep_states),
            time.monotonic(),
            negatives=leaf.negatives,
            trusted=leaf.closure_known,
            # The request names include dirs as given ("inc", "~/lib", a symlink): they must
            # still resolve to what this build used.
            paths=tuple(
                (os.fspath(given), anchors.expand(*anchored) or "")
                for given, anchored in zip(req[1], spec.include_dirs, strict=True)
            ),
        )

    def _init(self) -> Setup:
        setup = self._setup
        if setup is None:
            with self._init_lock:
                if self._setup is None:
                    fresh = Setup(self.config)
                    attrs = self._attrs
                    self._parts = (
                        Resolver(self.config, fresh, self._env, attrs),
                        Builder(self.config, fresh, self._env, self._counters, attrs),
                    )
                    self._setup = fresh  # last: a reader that sees it also sees _parts
                setup = self._setup
        return setup

    def _resolver(self) -> Resolver:
        self._init()
        assert self._parts is not None
        return self._parts[0]

    def _builder(self) -> Builder:
        self._init()
        assert self._parts is not None
        return self._parts[1]

    def _evicted(self, module: Module) -> None:
        # The module stays loaded while callers hold it; the finalizer unloads it after.
        instruments.evictions.add(1, self._attrs)


def _request(
    source: Source,
    include_dirs: Sequence[str],
    defines: Mapping[str, Any] | None,
    flags: Sequence[str],
    extras: Mapping[str, Any] | None,
    arch: str | None,
    name_expressions: Sequence[str],
) -> Request:
    """The hashable request (the same tuple ``compile`` builds inline on its hot path).
    Value types are part of it: ``1``, ``1.0`` and ``True`` compare equal but compile differently."""
    return (
        source,
        tuple(include_dirs),
        tuple((k, v.__class__, v) for k, v in defines.items()) if defines else (),
        tuple(flags),
        tuple((k, v.__class__, v) for k, v in extras.items()) if extras else (),
        arch,
        tuple(name_expressions),
    )


def _flush_at_exit(ref: weakref.ref[Runtime]) -> None:
    rt = ref()
    if rt is not None and not rt._closed:
        rt.flush_usage()
