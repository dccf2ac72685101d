"""Resolve: a compile request becomes a confined, policy-checked BuildSpec and its key."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..closure.anchors import Anchors
from ..closure.hashing import digest_bytes
from ..config import Config
from ..errors import ConfigError, KeyDeclarationError, LimitExceededError, PolicyError
from ..keys import KEY_SCHEMA, build_key
from ..policy import flags as flag_policy
from ..policy import roots as root_policy
from ..spec import BuildSpec, Source
from ..telemetry import ATTR, SPAN, instruments, span
from .parts import Parts
from .records import extra_text

__all__ = ["Request", "Resolved", "Resolver"]

#: (source, include_dirs, defines items, flags, extras items, arch, name expressions) — hashable.
Request = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A request resolved: its spec (confined, policy-checked), build key, and the
    anchors of this compile's roots; ``paths``: each path the request and the Config
    named (the source roots, include dirs, path flags, the source's file) as given, with
    what it resolved to — a memory entry stands only while each still resolves so."""

    spec: BuildSpec
    key: str
    anchors: Anchors
    paths: tuple[tuple[str, str], ...] = ()


class Resolver:
    """Turns requests into :class:`Resolved` specs (policy checks, confinement, key)."""

    def __init__(self, config: Config, parts: Parts, env: Sequence[tuple[str, str]], attrs: dict[str, str]) -> None:
        self.config = config
        self.parts = parts
        self.env = env
        self._attrs = attrs

    def resolve(self, req: Request) -> Resolved:
        """Request → BuildSpec (confined, policy-checked) and its build key."""
        source, include_dirs, typed_defines, flags, typed_extras, arch, name_expressions = req
        defines = tuple((k, v) for k, _, v in typed_defines)
        extras = tuple((k, v) for k, _, v in typed_extras)
        with span(SPAN.POLICY_CHECK) as s:
            try:
                paths: list[tuple[str, str]] = []
                spec, anchors = self.make_spec(
                    source, include_dirs, defines, flags, extras, arch, name_expressions, paths=paths
                )
            except (PolicyError, LimitExceededError, KeyDeclarationError) as exc:
                kind = type(exc).__name__
                s.set_attribute(ATTR.KIND, kind)
                instruments.policy_violations.add(1, {**self._attrs, ATTR.KIND: kind})
                raise
        with span(SPAN.KEY) as s:
            key = build_key(spec)
            s.set_attribute(ATTR.BUILD_KEY, key)
        return Resolved(spec, key, anchors, tuple(paths))

    def make_spec(
        self,
        source: Any,
        include_dirs: tuple[Any, ...],
        defines: tuple[Any, ...],
        flags: tuple[Any, ...],
        extras: tuple[Any, ...],
        arch: str | None,
        name_expressions: tuple[Any, ...] = (),
        *,
        paths: list[tuple[str, str]] | None = None,
    ) -> tuple[BuildSpec, Anchors]:
        """The confined, policy-checked spec of a request, and the anchors of its roots;
        ``paths`` is given each path named, with what it resolved to (:class:`Resolved`)."""
        seen = paths if paths is not None else []
        code, extra_values = _checked_inputs(
            self.config, source, include_dirs, defines, flags, extras, name_expressions
        )
        backend = self.parts.backend
        run = self.parts.runner(self.config)
        toolchain = backend.toolchain(source, run)
        language = backend.language(source)
        anchors = self.parts.anchors(toolchain, seen)

        def token(path: str, what: str) -> str:
            return Anchors.token(*_anchored(path, anchors, what, seen))

        incs, quote = _anchored_dirs(source, include_dirs, anchors, seen)
        # (-march=native: what it means here)
        machine = functools.partial(backend.resolve_machine_flags, toolchain=toolchain, language=language, run=run)
        checked_flags = flag_policy.check_flags(flags, token, family=backend.flag_family, machine=machine)
        arch = backend.resolve_arch(arch)
        checked_defines = flag_policy.check_defines(dict(defines))
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
            tenant=self.config.tenant,
            toolchain=toolchain,
            name=source.name,
            language=language,
            filename=source.staged_filename({"c++": ".cpp", "cuda": ".cu", "ascendc": ".cpp"}.get(language, ".c")),
            source_digest=digest_bytes(code),
            code=code,
            include_dirs=incs,
            quote_dir=quote,
            defines=checked_defines,
            flags=checked_flags,
            extras=extra_values,
            env=tuple(self.env),
            arch=arch,
            argv=argv,
            name_expressions=tuple(name_expressions),
        )
        return spec, anchors


def _checked_inputs(
    cfg: Config,
    source: Any,
    include_dirs: tuple[Any, ...],
    defines: tuple[Any, ...],
    flags: tuple[Any, ...],
    extras: tuple[Any, ...],
    name_expressions: tuple[Any, ...],
) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """The source's bytes and the extras' key text, once the request's types, text, size
    and declared extras are checked (before any toolchain is probed)."""
    if not isinstance(source, Source):
        raise ConfigError(f"source must be a safejit.Source, got {type(source).__name__}")
    if any(not isinstance(d, (str, os.PathLike)) for d in include_dirs):
        raise ConfigError("include_dirs must be a sequence of paths")
    _check_text("include_dirs", [os.fspath(d) for d in include_dirs])
    _check_text("flags", flags)
    _check_text("defines", [k for k, _ in defines] + [v for _, v in defines if isinstance(v, str)])
    _check_text("extras", [v for _, v in extras if isinstance(v, str)])
    for what, given in (("defines", defines), ("extras", extras)):
        for k, v in given:
            if isinstance(v, float) and not math.isfinite(v):  # (compile()'s arguments are refused so too)
                raise ConfigError(f"{what}[{k!r}] is {v!r}, not a finite number (give the text meant as a str)")
    if any(not isinstance(e, str) or not e for e in name_expressions):
        raise ConfigError("name_expressions must be non-empty strings")
    if any(c < " " or c == "\x7f" for e in name_expressions for c in e):
        # (NVRTC pastes each into a program of its own: a line break in one starts a directive)
        raise ConfigError("name_expressions must be C++ expressions on one line, without control characters")
    _check_text("name_expressions", name_expressions)
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
    return code, tuple(sorted((k, extra_text(k, v)) for k, v in extras))


def _anchored(path: Any, anchors: Anchors, what: str, seen: list[tuple[str, str]]) -> tuple[str, str]:
    """``(anchor, relative path)`` of ``path`` once confined under a root (``seen``
    is given the path and what it resolved to)."""
    given = os.fspath(path)
    real = root_policy.confine(given, anchors, what=what)
    seen.append((given, real))
    found = anchors.anchor(real)
    assert found is not None
    return found


def _anchored_dirs(
    source: Source, include_dirs: tuple[Any, ...], anchors: Anchors, seen: list[tuple[str, str]]
) -> tuple[tuple[tuple[str, str], ...], tuple[str, str] | None]:
    """The include dirs, anchored, and the source file's own directory (quoted includes
    are looked for there first) when it was read from a file."""
    incs = tuple(_anchored(d, anchors, "include dir", seen) for d in include_dirs)
    quote = None
    if source.origin is not None:
        origin = _anchored(source.origin, anchors, "source file", seen)
        quote = _anchored(os.path.dirname(anchors.expand(*origin) or ""), anchors, "source directory", [])
    return incs, quote


def _check_text(what: str, values: Any) -> None:
    """Every string in ``values`` is valid text: a lone surrogate can name no file and be
    no argument (it would fail deep inside as a UnicodeEncodeError)."""
    for value in values:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{what} holds {value!r}, which is not valid text (a lone surrogate)") from None
