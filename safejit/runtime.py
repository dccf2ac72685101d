"""Runtime: the public façade (DESIGN.md §1, §3).

    compile → memory tier (hot path: one call) → resolve → confine → build_key
            → disk → lock → compile → check closure → publish → load

``Runtime`` owns the public API and the memory tier; the data path below it is
``safejit._pipeline`` (``Resolver`` turns a request into a confined BuildSpec and its
key; ``Pipeline`` runs disk, lock, build, publish, load; ``Parts`` holds what the
first compile creates). Past the style's ~450 lines: most of it is the public API's
documentation, and fork and close handling, which belong to the façade alone.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _clock, _env, _forksafe
from ._arguments import argument_error, check_arguments
from ._pipeline.parts import Parts
from ._pipeline.pipeline import Pipeline
from ._pipeline.records import Counters, Explanation, artifact_of, name_of
from ._pipeline.resolve import Request, Resolved, Resolver
from ._place import placed, where
from .cache.leaf import VerifiedLeaf
from .cache.memory import Entry, MemoryTier
from .cache.usage import usage_name, write_usage
from .closure.hashing import open_regular
from .config import Config
from .errors import CacheError, ConfigError, LoadError, SafejitError
from .inventory import InventoryWriter
from .inventory import Request as InventoryRequest
from .kernel import Artifact, Module
from .outcomes import Miss, Tier
from .policy import roots as root_policy
from .spec import Source
from .telemetry import ATTR, SPAN, instruments, span

if TYPE_CHECKING:
    from .cache.remote.uploads import Uploads

__all__ = ["Explanation", "Runtime"]

logger = logging.getLogger(__name__)
#: The memory hit's clock (the staleness guarantee's: ``_clock``), one global load.
_monotonic = _clock.now
#: The define and extra values whose equality is their text's: a memory key tells any
#: other apart by its text too (``0.0 == -0.0``, in NumPy's floats too).
_EXACT = frozenset({str, int, bool, type(None)})


class Runtime:
    """Compiles, caches, loads. Lazy: nothing is touched until the first compile.

    >>> rt = Runtime()                                     # doctest: +SKIP
    >>> mod = rt.compile(Source("int add(int a,int b){return a+b;}", "add"))  # doctest: +SKIP
    >>> mod.kernel("add")(2, 3)                            # doctest: +SKIP
    5
    """

    def __init__(self, backend: str | None = None, *, config: Config | None = None) -> None:
        if config is not None and not isinstance(config, Config):
            raise ConfigError(f"Runtime(config=...) takes a safejit.Config, got {type(config).__name__}")
        if backend is not None and not isinstance(backend, str):
            hint = "; pass a Config as Runtime(config=...)" if isinstance(backend, Config) else ""
            raise ConfigError(f"Runtime's first argument is the backend's name, got {type(backend).__name__}{hint}")
        cfg = config if config is not None else Config.from_env()
        if backend is not None and backend != cfg.backend:
            cfg = cfg.replace(backend=backend)
        cfg.check_remote_keys()
        self.config = cfg
        self._env = _env.passthrough_values(cfg.env_passthrough)
        self._wired: tuple[Parts, Resolver, Pipeline] | None = None
        self._init_lock = _forksafe.Lock()
        #: The thread wiring the parts, while it does (what they log may reach a handler
        #: that calls back into this Runtime from that thread: told so, never waiting on
        #: itself for good).
        self._wiring: int | None = None
        self._attrs = {ATTR.BACKEND: cfg.backend, ATTR.TENANT: cfg.tenant}
        self._memory: MemoryTier[Module] = MemoryTier(
            max_entries=cfg.memory_max_entries,
            max_bytes=cfg.memory_max_bytes,
            max_staleness_s=cfg.max_staleness_s,
            on_evict=functools.partial(_evicted, self._attrs),  # (not a method: the tier keeps no runtime alive)
            trace_hits=cfg.trace_memory_hits,
            attrs=self._attrs,
        )
        #: The memory hit's one call on the owner, bound once (an attribute lookup less per hit).
        self._memory_get = self._memory.get
        self._counters = Counters()
        self._usage_name = usage_name()
        self._inventory = InventoryWriter(cfg.inventory) if cfg.inventory else None
        self._closed = False
        self._close_once = threading.Lock()  # (taken without waiting, never released: signal-safe)
        memory, attrs = self._memory, self._attrs  # (not the runtime: its hits are read once more when it goes)

        def observe() -> list[tuple[int, int, int, dict[str, str]]]:
            return [(memory.hits, len(memory), memory.bytes, attrs)]

        self._observer = observe
        instruments.register(observe)
        weakref.finalize(self, instruments.unregister, observe)
        _runtimes.add(self)  # (flushed at exit: one hook for them all, not one per Runtime ever made)

    def _after_fork(self) -> None:
        """In a forked child: its parts are its parent's (their worker processes, pipes
        and spare shims serve the parent), so it wires its own on its next compile
        (leaving those to the parent: each undoes only what its own process made); its
        counters and usage record are its own from now on. Modules loaded stay loaded."""
        self._wired = None
        self._counters.reset()
        self._usage_name = usage_name()

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
        and look up by name, e.g. ``("scale<float>",)``. A wrong argument (a bare str
        for a sequence, a non-mapping ``defines``) is a ConfigError naming it; an unknown
        keyword, Python's TypeError naming it (a ``**`` catch-all would cost every hit).
        """
        now = _monotonic()
        try:
            # The memory hit's path: the memory tier's key is the request tuple _request
            # builds, built here inline (a call more is a share of a 0.4 µs hit; so is
            # tuple() of an empty default), with the source's fields in place of the
            # Source (hashed in C). Arguments are checked on a miss.
            key = (
                source._key,
                tuple(include_dirs) if include_dirs else (),
                tuple(
                    (k, v.__class__ if v.__class__ in _EXACT else (v.__class__, str(v)), v) for k, v in defines.items()
                )
                if defines
                else (),
                tuple(flags) if flags else (),
                tuple(
                    (k, v.__class__ if v.__class__ in _EXACT else (v.__class__, str(v)), v) for k, v in extras.items()
                )
                if extras
                else (),
                arch,
                tuple(name_expressions) if name_expressions else (),
            )
            found = self._memory_get(key, now)
        except (AttributeError, TypeError, ValueError):  # (a request that cannot be built or hashed)
            raise argument_error(
                "compile", source, include_dirs=include_dirs, defines=defines, flags=flags, extras=extras,
                arch=arch, name_expressions=name_expressions,
            ) from None  # fmt: skip
        if found is not None:
            return found
        # The slow path: an invalid request is never stored, so it never hits.
        check_arguments(
            "compile", source, include_dirs=include_dirs, defines=defines, flags=flags, extras=extras, arch=arch,
            name_expressions=name_expressions,
        )  # fmt: skip
        return self._compile_slow(source, key, now)

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
        if self._closed:
            raise LoadError("the runtime is closed")
        req = _request(source, include_dirs, defines, flags, extras, arch, name_expressions, checked_for="build")
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: name_of(source)}) as root_span:
            _, resolver, pipeline = self._init()
            obtained = pipeline.obtain(resolver.resolve(req))
            root_span.set_attribute(ATTR.TIER, obtained.tier)
            return artifact_of(obtained.leaf, obtained.tier)

    def source(self, path: str | os.PathLike[str], *, name: str | None = None) -> Source:
        """Read a source file under the declared source roots. The file is opened first,
        then confined by where the opened file really is: a path swapped for a symlink
        meanwhile cannot make it read another file."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"Runtime.source takes a path, got {type(path).__name__}")
        anchors = root_policy.build_anchors(self.config.source_roots, ())
        given = os.fspath(path)
        root_policy.confine(given, anchors, what="source file")  # (a clear error before opening)
        try:
            fd, _ = open_regular(given)
        except OSError as exc:
            raise ConfigError(f"source file {given!r} cannot be read: {exc.strerror}", path=given) from None
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            root_policy.confine(real, anchors, what="source file")
            return Source.from_fd(fd, given, name=name, max_bytes=self.config.max_source_bytes)
        finally:
            os.close(fd)

    def warm(self, request: InventoryRequest, *, fill_remote: bool = False) -> str:
        """Build one inventory request unless it already verifies: ``hit`` (on disk),
        ``remote`` (a verified remote hit), ``built`` or ``skipped`` (a root it names
        is not declared here). ``fill_remote``: a disk hit is offered to the remote
        tier too, which uploads it unless the remote's index has it (a build service
        refilling a fleet's cache); see :meth:`flush_uploads`."""
        d = request.data
        probe = Source(d["code"], d["name"], filename=d["filename"])
        parts, resolver, pipeline = self._init()
        anchors = parts.anchors(parts.backend.toolchain(probe, parts.runner(self.config)))
        args = request.arguments(anchors)
        if args is None:
            return "skipped"
        source = args.pop("source")
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: name_of(source)}) as root_span:
            resolved = resolver.resolve(_request(source, name_expressions=(), **args))
            found = parts.disk.lookup(resolved.key, resolved.anchors, quiet=True)
            if isinstance(found, VerifiedLeaf):
                root_span.set_attribute(ATTR.TIER, Tier.DISK)
                if fill_remote and parts.remote is not None:
                    parts.remote.offer(resolved.key, found, None, unless_present=True)
                return "hit"
            obtained = pipeline.obtain(resolved)
            root_span.set_attribute(ATTR.TIER, obtained.tier)
        return "remote" if obtained.tier is Tier.REMOTE else "built"

    def flush_uploads(self, timeout: float = 60.0) -> Uploads:
        """Wait (at most ``timeout`` seconds) for the remote uploads this runtime queued,
        and say what became of those finished since the last call (``Uploads``: ``done``,
        and one ``UploadResult`` per upload: build key, deps key, outcome, detail).
        Nothing to wait for without a remote."""
        from .cache.remote.uploads import Uploads

        remote = self._wired[0].remote if self._wired is not None else None
        return remote.uploads.drain(timeout) if remote is not None else Uploads(True, ())

    def stats(self) -> Mapping[str, int]:
        out = self._counters.snapshot()
        out["memory_hits"] = self._memory.hits
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
        """Say whether a compile would hit the disk tier and, if not, why; when no leaf
        has the build key, which inputs differ from the nearest other build of the kernel
        (a diagnostic: that walks the cache's leaves, so it costs more as the cache grows)."""
        req = _request(source, include_dirs, defines, flags, extras, arch, name_expressions, checked_for="explain")
        parts, resolver, _ = self._init()
        resolved = resolver.resolve(req)
        found = parts.disk.lookup(resolved.key, resolved.anchors, quiet=True)
        if isinstance(found, VerifiedLeaf):
            return Explanation.of(None, resolved.key, leaf=found.path)
        nearest = None
        if found.reason is Miss.ABSENT:
            from ._pipeline.nearest import nearest_build

            nearest = nearest_build(parts.disk.roots, resolved.spec, self.config.backend)
        return Explanation.of(
            found.reason, resolved.key, path=found.detail or None, leaf=found.leaf or None, nearest=nearest
        )

    def close(self) -> None:
        """Close every cached module (each unloaded once nothing holds it) and release resources. Safe to call twice."""
        # (no lock: close() may run in a signal handler or a finalizer of the very thread
        # that is wiring parts, which then finds it closed and closes them itself)
        first = self._close_once.acquire(blocking=False)  # (never released: one close writes the record)
        self._closed = True
        if first:
            try:
                self.flush_usage()
            finally:
                self._release()
        else:
            self._release()

    def _release(self) -> None:
        for entry in self._memory.close():  # (a compile that ends after this is refused its entry)
            entry.value.close()
        instruments.unregister(self._observer)
        wired = self._wired
        if wired is not None:
            wired[0].close()

    def flush_usage(self) -> None:
        """Write this process's counters into the cache root for ``safejit stats``.
        A failure is the cache's: a CacheError under ``on_cache_error="raise"``."""
        wired = self._wired
        if wired is None:
            return
        root = wired[0].disk.writable_root(make=False)  # (one removed meanwhile is not made again)
        stats = self.stats()
        if root is None or not any(stats[k] for k in ("compiles", "memory_hits", "disk_hits", "misses")):
            return
        try:
            write_usage(
                root, self.config.tenant, self._usage_name, self.config.backend, stats, self._counters.compile_seconds
            )
        except OSError as exc:
            if self.config.on_cache_error == "raise":
                raise CacheError(f"writing the usage record failed: {exc}", errno=exc.errno, path=root) from exc
            logger.warning("could not write the usage record in %s: %s", root, exc)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except CacheError as error:  # (the exception under way is the one to see; this one is said)
            logger.warning("%s", error)

    # -- the data path -------------------------------------------------------
    def _compile_slow(self, source: Source, key: Request, now: float) -> Module:
        """``compile`` past a memory hit: ``key`` is its memory key (``source._key`` first)."""
        if self._closed:
            raise LoadError("the runtime is closed")
        request = key
        if placed(key):  # (what it names depends on where this process is: so does its entry)
            key = (*key, where())
        with span(SPAN.COMPILE, {**self._attrs, ATTR.KERNEL: name_of(source)}) as root_span:
            found = self._memory.find(key, now)
            if isinstance(found, Module):
                root_span.set_attribute(ATTR.TIER, Tier.MEMORY)
                return found
            if found is Miss.STALE:
                self._counters.add(Miss.STALE.value)
                logger.info("memory entry for %s is stale; looking again", name_of(source))
            made_here = False

            def make() -> tuple[Entry[Module], Module]:
                nonlocal made_here
                made_here = True
                entry, module = self._produce((source, *request[1:]))
                # A module its caller closed is no hit for the next call: it loads afresh.
                module._when_closed(_forget(self._memory, key))
                return entry, module

            module = self._memory.produce(key, make, now, found)
            # (a call that waited on another's compile was served from memory)
            root_span.set_attribute(ATTR.TIER, module.artifact.tier if made_here else Tier.MEMORY)
            return module

    def _produce(self, req: Request) -> tuple[Entry[Module], Module]:
        """A memory entry for ``req``, and the module this call returns."""
        parts, resolver, pipeline = self._init()
        resolved = resolver.resolve(req)
        obtained = pipeline.obtain(resolved, lambda leaf: self._load(parts, resolved, leaf))
        if self._inventory is not None:  # (what compiled and loaded: a request that failed would fail every warm)
            self._inventory.record(resolved.spec, self.config.backend)
        leaf = obtained.leaf
        module = Module(obtained.library, artifact_of(leaf, obtained.tier), self.config.backend)
        entry = Entry(
            module.found_in(Tier.MEMORY),
            Entry.charge(len(leaf.artifact), leaf.dep_states, len(leaf.negatives)),
            Entry.dep_list(leaf.dep_states),
            # A build no one vouches for (a header changed while it compiled: an empty
            # digest) was never found current: the next call revalidates it, and rebuilds.
            leaf.checked if all(state[2] for state in leaf.dep_states) else -math.inf,
            negatives=leaf.negatives,
            trusted=leaf.closure_known,
            # (the roots, include dirs, path flags and source file as named: "inc", "~/lib",
            # a symlink; they must still resolve as they did for the entry to stand)
            paths=tuple(dict.fromkeys(resolved.paths)),
            toolchain=functools.partial(parts.backend.toolchain_unchanged, resolved.spec),
        )
        return entry, module

    def _load(self, parts: Parts, resolved: Resolved, leaf: VerifiedLeaf) -> Any:
        name = resolved.spec.name
        with span(SPAN.LOAD, {ATTR.BYTES: len(leaf.artifact)}):
            started = time.perf_counter()
            try:
                library = parts.backend.load(leaf.artifact, name=name, options=leaf.manifest.meta_dict())
            except OSError as exc:
                raise LoadError(f"{name}: loading the verified artifact failed: {exc}", name=name) from exc
            instruments.load_duration.record(time.perf_counter() - started, self._attrs)
        return library

    def _init(self) -> tuple[Parts, Resolver, Pipeline]:
        wired = self._wired
        if wired is None or self._closed:
            if self._wiring == threading.get_ident():
                raise LoadError(_CALLED_BACK)
            with self._init_lock:
                if self._closed:  # (parts wired after close would be closed by no one)
                    raise LoadError("the runtime is closed")
                if self._wired is None:
                    self._wiring = threading.get_ident()
                    try:
                        parts = Parts(self.config, self._env)
                        resolver = Resolver(self.config, parts, self._env, self._attrs)
                        self._wired = (parts, resolver, Pipeline(self.config, parts, self._counters, self._attrs))
                    finally:
                        self._wiring = None
                    if self._closed:  # (closed while they were wired: their close is ours)
                        self._wired = None
                        parts.close()
                        raise LoadError("the runtime is closed")
                wired = self._wired
        return wired


_CALLED_BACK = (
    "the runtime was called into while it was being set up, by the thread setting it up (a logging "
    "handler of its warnings?): call it from elsewhere, or after"
)


def _forget(memory: MemoryTier[Module], key: Hashable) -> Callable[[], None]:
    """What drops ``key``'s entry from ``memory`` once its module is closed (keeping
    neither the tier nor the module alive)."""
    memory_ref = weakref.ref(memory)

    def forget() -> None:
        held = memory_ref()
        if held is not None:
            held.discard_if(key, _is_closed)

    return forget


def _is_closed(module: Module) -> bool:
    return module.closed


def _evicted(attrs: Mapping[str, str], module: Module) -> None:
    # The module stays loaded while callers hold it; the finalizer unloads it after.
    instruments.evictions.add(1, attrs)


def _request(
    source: Source,
    include_dirs: Sequence[str],
    defines: Mapping[str, Any] | None,
    flags: Sequence[str],
    extras: Mapping[str, Any] | None,
    arch: str | None,
    name_expressions: Sequence[str],
    *,
    checked_for: str | None = None,
) -> Request:
    """The hashable request (the same tuple ``compile`` builds inline on its hot path).
    Value types are part of it: ``1``, ``1.0`` and ``True`` compare equal but compile differently.
    A value of any type but those compared exactly (:data:`_EXACT`) is told apart by its
    text too, as the compiler is given it: ``0.0`` and ``-0.0`` compare equal (NumPy's
    too).
    ``checked_for``: the public call (``build``, ``explain``) whose arguments are checked
    first, a wrong one a ConfigError naming it."""
    if checked_for is not None:
        check_arguments(
            checked_for, source, include_dirs=include_dirs, defines=defines, flags=flags, extras=extras, arch=arch,
            name_expressions=name_expressions,
        )  # fmt: skip
    return (
        source,
        tuple(include_dirs),
        tuple((k, v.__class__ if v.__class__ in _EXACT else (v.__class__, str(v)), v) for k, v in defines.items())
        if defines
        else (),
        tuple(flags),
        tuple((k, v.__class__ if v.__class__ in _EXACT else (v.__class__, str(v)), v) for k, v in extras.items())
        if extras
        else (),
        arch,
        tuple(name_expressions),
    )


def _flush_at_exit() -> None:
    for rt in list(_runtimes):
        if not rt._closed:
            try:
                rt.flush_usage()
            except SafejitError as exc:  # (at exit: said, never a traceback)
                logger.warning("%s", exc)


#: Every Runtime of this process, for the fork and exit hooks.
_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()
atexit.register(_flush_at_exit)


def _after_fork_in_child() -> None:
    for rt in list(_runtimes):
        rt._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
