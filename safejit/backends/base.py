"""The Backend protocol every backend implements, and what it exchanges.

Backends never import ``policy`` or ``cache``: the runtime hands them a
:class:`Runner` (the sandbox) and the anchors' ``expand_text``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..spec import BuildSpec, Source, Toolchain

__all__ = ["Backend", "CompileOutput", "LoadedLibrary", "Products", "RunOutcome", "Runner", "macro_flags"]


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
    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float | None = None,
        extra_read: Sequence[str] = (),
        watch: Sequence[str] = (),
    ) -> RunOutcome:
        """``watch``: files the step writes (a depfile, the artifact), which the runner
        may read as they are closed, while the step still runs: ``files`` then holds
        them as they were when the step ended. A runner is free to ignore it."""


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
    #: The other tools' (assembler, linker) lists of the files they read, raw
    #: (``{path: bytes}``; None: not written): part of the closure, but not sources.
    read_lists: dict[str, bytes | None] = field(default_factory=dict)
    #: Paths the compiler looked up and did not find, when its lookups were recorded
    #: (NVRTC in its worker): the negative dependencies, exactly. None: not recorded (a
    #: depfile names only what was found); they are then derived from the search path.
    absent: tuple[str, ...] | None = None


class LoadedLibrary(Protocol):
    def function(self, name: str, **options: Any) -> Any: ...
    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    artifact_ext: str
    #: Bumped when the backend changes how it builds argv or artifacts.
    abi: int
    #: Flag families this backend allows on top of the common allow-list.
    extra_flags: tuple[str, ...]

    def resolve_arch(self, arch: str | None) -> str | None: ...

    def close(self) -> None: ...

    def toolchain(self, source: Source, run: Runner) -> Toolchain: ...

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
    ) -> tuple[str, ...]: ...

    def compile(
        self,
        spec: BuildSpec,
        *,
        workdir: str,
        expand: Callable[[str], str],
        run: Runner,
        timeout: float,
        search_dirs: Sequence[str] = (),
        confine: Callable[[str], str] | None = None,
        max_deps: int = 20_000,
        read_roots: Sequence[str] = (),
    ) -> CompileOutput:
        """``read_roots``: the resolved roots the compiler may read (declared and the
        toolchain's), for a compiler that does not run through ``run``."""
        ...

    def products(self, artifact: bytes) -> Products | None:
        """An artifact's kernels and metadata, read from its bytes alone, exactly as
        ``compile`` reports them; None when they take more than the bytes."""
        ...

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> LoadedLibrary: ...


def macro_flags(defines: Sequence[tuple[str, str | None]]) -> list[str]:
    """``-DNAME`` / ``-DNAME=VALUE`` for checked defines (the same for every compiler)."""
    return [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines]
