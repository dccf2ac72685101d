"""A backend that needs no compiler: for the pipeline's own tests, and for users'
tests of code that calls safejit (``Config(backend="fake")``).

It "compiles" a source by reading it and every file it ``#include``s — quoted
includes next to their includer first, then the include dirs, angle includes in the
include dirs only; each file confined to the declared roots, as a compiler under the
sandbox would be — and records every ``#define NAME VALUE`` it meets, after the
``defines`` given to ``compile()``. Its kernels are those macros: calling kernel
``NAME`` returns the macro's value (an ``int`` when it is one, else its text). The
artifact is a small, deterministic description of that, so the whole data path —
keys, closure, negative lookups, disk leaves, staleness, publish faults — behaves as
with a real compiler, in microseconds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import faults
from ..closure.hashing import digest_bytes, read_file
from ..errors import CompileError, FlagPolicyError, LimitExceededError, LoadError
from ..spec import BuildSpec, Source, Toolchain
from .base import CompileContext, CompileOutput, Products, Runner, macro_flags

__all__ = ["FakeBackend", "FakeKernel", "FakeLibrary"]

_INCLUDE: Final = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_DEFINE: Final = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*([^\n]*)$", re.M)
_MAGIC: Final = b"safejit-fake-1\n"


class FakeBackend:
    """See the module docstring."""

    name = "fake"
    artifact_ext = "fake"
    abi = 1
    #: It takes what the host compilers take (and ignores it): tests see the same policy.
    flag_family = "gcc"
    needs_workdir = False

    def __init__(self, **_: Any) -> None:
        pass

    def language(self, source: Source) -> str:
        return "c"

    def resolve_arch(self, arch: str | None) -> str | None:
        return arch

    def resolve_machine_flags(
        self, flags: tuple[str, ...], *, toolchain: Toolchain, language: str, run: Runner
    ) -> tuple[str, ...]:
        raise FlagPolicyError(f"{flags[0]!r}: the fake backend has no machine to resolve it on", flag=flags[0])

    def toolchain(self, source: Source, run: Runner) -> Toolchain:
        return Toolchain(compiler="fake", version="safejit fake backend 1", digest=digest_bytes(_MAGIC), roots=())

    def toolchain_unchanged(self, spec: BuildSpec, since: float) -> bool:
        return True

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
        quote = ("-iquote", quote_dir) if quote_dir is not None else ()
        return ("fake", *flags, *macro_flags(defines), *(f"-I{d}" for d in include_dirs), *quote)

    def compile(self, ctx: CompileContext) -> CompileOutput:
        faults.point("compiler.spawn")  # (a delay here stands for a slow compiler)
        ctx.started()
        spec = ctx.spec
        macros: dict[str, str] = {}
        for flag in ctx.spec.argv:
            if flag.startswith("-D"):
                name, _, value = flag[2:].partition("=")
                macros[name] = value or "1"
        read: dict[str, None] = {}
        self._scan(spec.code, None, ctx, macros, read)
        kernels = tuple(sorted(macros))
        artifact = _MAGIC + json.dumps(macros, sort_keys=True).encode()
        return CompileOutput(artifact, tuple(read), kernels, "", spec.argv, 0.0)

    def _scan(
        self, data: bytes, path: str | None, ctx: CompileContext, macros: dict[str, str], read: dict[str, None]
    ) -> None:
        text = data.decode("utf-8", "replace")
        for match in _INCLUDE.finditer(text):
            found = self._find(match.group(1), match.group(2).strip(), path, ctx)
            if found in read:
                continue
            if len(read) >= ctx.max_deps:
                raise LimitExceededError(f"more than {ctx.max_deps} dependencies", limit=ctx.max_deps)
            read[found] = None
            try:
                content, _ = read_file(found)
            except OSError as exc:
                raise CompileError(f"{found}: {exc.strerror}", log=str(exc)) from None
            self._scan(content, found, ctx, macros, read)
        for name, value in _DEFINE.findall(text):
            macros[name] = value.strip()

    @staticmethod
    def _find(kind: str, name: str, includer: str | None, ctx: CompileContext) -> str:
        here = [os.path.dirname(includer)] if kind == '"' and includer else []
        for d in (*here, *ctx.search_dirs):
            candidate = os.path.join(d, name)
            if os.path.isfile(candidate):
                return ctx.confine(candidate)
        raise CompileError(f"{ctx.spec.name}: cannot find include {name!r}", log=f"fatal error: {name}: not found")

    def products(self, artifact: bytes) -> Products:
        return tuple(sorted(_macros(artifact))), {}

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> FakeLibrary:
        return FakeLibrary(_macros(artifact))

    def close(self) -> None:
        pass


def _macros(artifact: bytes) -> dict[str, str]:
    if not artifact.startswith(_MAGIC):
        raise LoadError("not an artifact of the fake backend")
    try:
        found = json.loads(artifact[len(_MAGIC) :])
    except ValueError as exc:
        raise LoadError(f"a damaged fake artifact: {exc}") from None
    if not isinstance(found, dict):
        raise LoadError("a damaged fake artifact")
    return {str(k): str(v) for k, v in found.items()}


class FakeKernel:
    """A fake build's kernel: called (or launched), it gives its macro's value."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: int | str) -> None:
        self.name, self.value = name, value

    def __call__(self, *args: object) -> int | str:
        return self.value

    def launch(self, *args: object, **options: object) -> int | str:
        return self.value


class FakeLibrary:
    """The macros of a fake build; ``function(name)`` returns a callable giving the value."""

    def __init__(self, macros: Mapping[str, str]) -> None:
        self._macros: dict[str, str] | None = dict(macros)

    def function(self, name: str, **options: Any) -> Any:
        if self._macros is None:
            raise LoadError("library is closed")
        if name not in self._macros:
            raise KeyError(name)
        text = self._macros[name]
        return FakeKernel(name, int(text) if re.fullmatch(r"-?[0-9]+", text) else text)

    def close(self) -> None:
        self._macros = None
