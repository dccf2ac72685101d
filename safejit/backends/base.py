"""The Backend protocol every backend implements, and what it exchanges.

Backends never import ``policy``, ``cache`` or the composer: the composer hands a
backend one :class:`CompileContext` (the spec, the sandboxed runner, where to work,
how to confine a path) and hears back through :class:`CompileEvents` while the
compiler runs. A backend owns its work directory's file names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..spec import BuildSpec, Source, Toolchain

__all__ = [
    "Backend",
    "CompileContext",
    "CompileEvents",
    "CompileOutput",
    "LoadedLibrary",
    "Products",
    "RunOutcome",
    "Runner",
    "macro_flags",
]


#: What a compile made besides the bytes, as the manifest keeps it: the kernels' names
#: and the backend's metadata (CUDA: parameter layouts, lowered names).
Products = tuple[tuple[str, ...], dict[str, Any]]


class RunOutcome(Protocol):
    @property
    def returncode(self) -> int: ...
    @property
    def log(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def files(self) -> Mapping[str, bytes]: ...


class Runner(Protocol):
    """Runs one argv in the sandbox (the only way a backend starts a process)."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float | None = None,
        extra_read: Sequence[str] = (),
        watch: Sequence[str] = (),
        on_closed: Callable[[str, bytes], None] | None = None,
    ) -> RunOutcome:
        """``cwd``: where it runs ("" for a probe: a private scratch dir). ``watch``:
        files the step writes (a depfile, the artifact), which the runner may read as
        they are closed while the step still runs, telling ``on_closed(path, data)``;
        ``files`` then holds them as they were when the step ended. A runner is free
        to ignore it. ``extra_read``: more roots the step may read."""


class CompileEvents(Protocol):
    """What the composer wants to hear while a compile runs (each optional to act on)."""

    def started(self) -> None:
        """The compiler has started (once; in process: the compile begins)."""

    def listed(self, deps: tuple[str, ...], complete: bool) -> None:
        """The compiler listed what it read (its depfile is written; its assembler and
        linker may still run). ``complete``: the list names the source itself."""

    def closed_artifact(self, data: bytes, tool_reads: Mapping[str, tuple[str, ...]] | None) -> None:
        """The compiler closed its artifact holding ``data`` (it may close it again);
        ``tool_reads``: what the other tools had read by then (None: not known yet)."""

    def looked(self, data: bytes) -> None:
        """A program that records its lookups (``sandbox.lookups``: a preprocessor, the
        assembler) closed the run's records, holding ``data`` (more may follow)."""


@dataclass(frozen=True, slots=True)
class CompileContext:
    """Everything one compile needs from the composer."""

    spec: BuildSpec
    #: The scratch directory a compiler process works in ("" for one in this process).
    workdir: str
    #: Anchored tokens in argv text → absolute paths.
    expand: Callable[[str], str]
    run: Runner
    timeout: float
    #: The include search list, in order (quote chain first), for backends that search themselves.
    search_dirs: Sequence[str]
    #: A path → its confined real path, or ``PathConfinementError``.
    confine: Callable[[str], str]
    max_deps: int
    events: CompileEvents | None = None
    #: The largest artifact the build may make (``Config.max_artifact_bytes``): one larger
    #: is refused before it is read.
    max_artifact_bytes: int | None = None
    #: The resolved roots the compiler may read (declared and the toolchain's), for a
    #: compiler that does not run through ``run`` (NVRTC's worker).
    read_roots: Sequence[str] = ()

    def started(self) -> None:
        if self.events is not None:
            self.events.started()


@dataclass(frozen=True, slots=True)
class CompileOutput:
    artifact: bytes
    #: Absolute paths the compiler reported reading, the staged source excluded.
    deps: tuple[str, ...]
    kernels: tuple[str, ...]
    log: str
    argv: tuple[str, ...]
    seconds: float
    #: False when the dependency scan missed the source itself (never published).
    complete: bool = True
    #: Backend metadata kept in the manifest (CUDA: parameter layouts, lowered names).
    meta: dict[str, Any] = field(default_factory=dict)
    #: What tools other than the compiler read beyond ``deps`` (``{"assembler": paths,
    #: "linker": paths}``; the toolchain's own link inputs aside): part of the closure.
    tool_reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Paths the compiler looked up and did not find, when its lookups were recorded
    #: (NVRTC in its worker): the negative dependencies, exactly. None: not recorded (a
    #: depfile names only what was found); they are then derived from the search path.
    absent: tuple[str, ...] | None = None
    #: What the compile ran within, where that is not the sandbox's runs
    #: (``Sandbox.describe``): NVRTC's worker (``NvrtcWorker.walls``), or NVRTC in this
    #: process (``in-process``). None: the sandbox's.
    walls: str | None = None


class LoadedLibrary(Protocol):
    def function(self, name: str, **options: Any) -> Any: ...
    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    artifact_ext: str
    #: Bumped when the backend changes how it builds argv or artifacts.
    abi: int

    @property
    def flag_family(self) -> str:
        """The table of compiler flags tenants may pass (``safejit.policy.flag_tables``):
        "gcc", "nvcc", "nvrtc" or "bisheng"."""
        ...

    @property
    def needs_workdir(self) -> bool:
        """Whether its compiler is a process that needs a scratch work dir (NVRTC: no)."""
        ...

    def resolve_arch(self, arch: str | None) -> str | None:
        """The target architecture to key and compile for (None where there is none)."""
        ...

    def resolve_machine_flags(
        self, flags: tuple[str, ...], *, toolchain: Toolchain, language: str, run: Runner
    ) -> tuple[str, ...]:
        """What machine-dependent ``flags`` (``-march=native``) mean on this machine, as
        flags of the backend's family that say so explicitly (DESIGN.md §4)."""
        ...

    def close(self) -> None: ...

    def toolchain(self, source: Source, run: Runner) -> Toolchain:
        """The probed toolchain that compiles ``source`` (remembered)."""
        ...

    def toolchain_unchanged(self, spec: BuildSpec, since: float) -> bool:
        """Whether the toolchain ``spec`` was keyed by is still the one its compiler is,
        as it was when the build began (``since``, ``_clock.now()``): asked after a build, before
        it is published (one built across an upgrade is not); when not, it is probed
        again next time."""
        ...

    def language(self, source: Source) -> str: ...

    def argv(
        self,
        *,
        toolchain: Toolchain,
        language: str,
        flags: Sequence[str],
        defines: Sequence[tuple[str, str | None]],
        include_dirs: Sequence[str],
        quote_dir: str | None,
        arch: str | None,
    ) -> tuple[str, ...]:
        """The final argv, with anchored tokens and ``{SRC}``/``{OUT}``/``{DEP}`` slots."""
        ...

    def compile(self, ctx: CompileContext) -> CompileOutput:
        """Compile ``ctx.spec``; raise ``CompileError`` (with the log) on failure."""
        ...

    def products(self, artifact: bytes) -> Products | None:
        """An artifact's kernels and metadata, read from its bytes alone, exactly as
        ``compile`` reports them; None when they take more than the bytes."""
        ...

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> LoadedLibrary:
        """Load verified bytes (never a path)."""
        ...


def macro_flags(defines: Sequence[tuple[str, str | None]]) -> list[str]:
    """``-DNAME`` / ``-DNAME=VALUE`` for checked defines (the same for every compiler)."""
    return [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines]
