"""``safejit explain SOURCE``: would a compile hit, and if not, why — and, when no leaf
has this build key, which input differs from the nearest other build of the same
kernel (``Manifest.inputs``: source, flags, defines, include dirs, extras,
environment, arch, toolchain)."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..cache import maintenance
from ..cache.layout import build_key_of, deps_key_of
from ..cache.leaf import Manifest, ManifestError
from ..outcomes import Miss
from ..runtime import Runtime
from ..spec import BuildSpec
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, ago, cache_roots, config_for
from ._out import Out

__all__ = ["Difference", "cmd_explain", "differences"]

_TOKEN: Final = re.compile("\0([a-z][0-9]+)\0")


@dataclass(frozen=True, slots=True)
class Difference:
    """One input of the build key that differs: ``input`` is ``source``, ``language``,
    ``arch``, ``flags``, ``defines``, ``include_dirs``, ``extras``, ``env``,
    ``toolchain`` or ``other``; ``detail`` says how, for people."""

    input: str
    detail: str


def _shown(text: str | None) -> str:
    return "-" if text is None else _TOKEN.sub(lambda m: "{" + m.group(1) + "}", text)


def _pairs(
    what: str, label: str, here: Iterable[tuple[str, Any]], there: Iterable[tuple[str, Any]]
) -> list[Difference]:
    """Differences between two name → value listings (defines, extras, env)."""
    mine, theirs = dict(here), dict(there)
    found = []
    for name in sorted(mine.keys() | theirs.keys()):
        if name not in theirs:
            found.append(Difference(what, f"{label} {name}: here only"))
        elif name not in mine:
            found.append(Difference(what, f"{label} {name}: there only"))
        elif mine[name] != theirs[name]:
            if what == "env":  # (only digests are kept: the values are not shown)
                found.append(Difference(what, f"{label} {name}: its value differs"))
            else:
                found.append(
                    Difference(what, f"{label} {name}: {_shown(mine[name])} here, {_shown(theirs[name])} there")
                )
    return found


def _lists(what: str, label: str, here: Sequence[str], there: Sequence[str]) -> list[Difference]:
    """Differences between two ordered lists (flags, include dirs)."""
    if list(here) == list(there):
        return []
    found = [Difference(what, f"{label} {_shown(x)}: here only") for x in here if x not in there]
    found += [Difference(what, f"{label} {_shown(x)}: there only") for x in there if x not in here]
    return found or [Difference(what, f"the {label}s are in another order")]


def differences(spec: BuildSpec, env_digests: Sequence[tuple[str, str]], man: Manifest) -> list[Difference]:
    """Which inputs of ``spec`` (this request, resolved) differ from those ``man`` was
    built with. ``env_digests``: this request's environment as the manifest keeps it."""
    i = man.inputs
    if i is None:
        return [Difference("other", "the other build's inputs were not recorded (an older safejit built it)")]
    found = []
    if spec.source_digest != i.source_digest:
        found.append(Difference("source", "the source text differs"))
    if spec.language != i.language:
        found.append(Difference("language", f"language {spec.language} here, {i.language} there"))
    if spec.arch != i.arch:
        found.append(Difference("arch", f"arch {spec.arch or '-'} here, {i.arch or '-'} there"))
    found += _lists("flags", "flag", spec.flags, i.flags)
    found += _pairs("defines", "define", spec.defines, i.defines)
    incs = [f"{a}/{r}" for a, r in spec.include_dirs], [f"{a}/{r}" for a, r in i.include_dirs]
    found += _lists("include_dirs", "include dir", *incs)
    found += _pairs("extras", "extra", spec.extras, i.extras)
    found += _pairs("env", "environment variable", env_digests, i.env)
    if spec.toolchain.digest != man.toolchain.get("digest"):
        versions = (
            (spec.toolchain.version.splitlines() or ["?"])[0],
            (man.toolchain.get("version", "").splitlines() or ["?"])[0],
        )
        found.append(Difference("toolchain", f"the toolchain differs: {versions[0]} here, {versions[1]} there"))
    if not found and tuple(spec.argv) != tuple(man.argv):
        found.append(Difference("other", "the compiler command line differs"))
    if not found:
        found.append(Difference("other", "the key's schema or the backend's ABI differs (another safejit version)"))
    return found


@dataclass(frozen=True, slots=True)
class Nearest:
    info: maintenance.LeafInfo
    manifest: Manifest
    differs: list[Difference]


def nearest_build(
    roots: Iterable[str], spec: BuildSpec, env: Sequence[tuple[str, str]], backend: str
) -> Nearest | None:
    """The other build of ``spec``'s kernel (same tenant and backend) whose inputs differ
    least from this request's; the newest of those. Unreadable manifests are skipped."""
    best: tuple[tuple[int, float], Nearest] | None = None
    for root in roots:
        for info in maintenance.iter_leaves(root):
            if info.tenant != spec.tenant or info.backend != backend:
                continue
            try:
                man = maintenance.read_manifest(info)
            except (OSError, ManifestError):
                continue
            if man.name != spec.name:
                continue
            found = differences(spec, env, man)
            rank = (len(found), -man.created)
            if best is None or rank < best[0]:
                best = (rank, Nearest(info, man, found))
    return best[1] if best is not None else None


def _value(text: str) -> Any:
    """An ``--extra`` value: JSON (``132``, ``true``, ``"a b"``), else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text


def cmd_explain(args: argparse.Namespace, out: Out) -> int:
    if args.cache_dir:
        cache_roots(args.cache_dir)  # (a missing directory is an error, not a miss)
    cfg = config_for(args.cache_dir, backend=args.backend, tenant=args.tenant, source_roots=tuple(args.source_root))
    defines = dict(d.split("=", 1) if "=" in d else (d, None) for d in args.define)
    extras = {}
    for e in args.extra:
        name, sep, value = e.partition("=")
        if not sep:
            raise CliError(f"--extra {e}: expected NAME=VALUE")
        extras[name] = _value(value)
    kwargs: dict[str, Any] = {
        "include_dirs": tuple(args.include),
        "defines": defines,
        "flags": tuple(args.flag),
        "extras": extras,
        "arch": args.arch,
    }
    with Runtime(config=cfg) as rt, out.status(f"looking up {args.source}"):
        source = rt.source(args.source)
        explanation = rt.explain(source, **kwargs)
        nearest = None
        if explanation.miss is Miss.ABSENT:
            spec, env = _resolved(rt, source, kwargs)
            nearest = nearest_build(cfg.resolved_cache_dirs(), spec, env, cfg.backend)
    if args.json:
        out.json(_json(explanation, source.name, nearest))
    else:
        _show(out, explanation, source.name, nearest)
    return EXIT_OK if explanation.result == "hit" else EXIT_FINDINGS


def _resolved(rt: Runtime, source: Any, kwargs: dict[str, Any]) -> tuple[BuildSpec, list[tuple[str, str]]]:
    """This request resolved as ``compile`` would (its spec, and its environment as a
    manifest keeps it: value digests). Reaches into the Runtime's wiring: ``Explanation``
    does not carry the spec (yet)."""
    from ..closure.hashing import digest_bytes
    from ..runtime import _request

    _, resolver, _ = rt._init()
    req = _request(
        source, kwargs["include_dirs"], kwargs["defines"], kwargs["flags"], kwargs["extras"], kwargs["arch"], ()
    )
    spec = resolver.resolve(req).spec
    return spec, [(name, digest_bytes(value.encode())) for name, value in spec.env]


def _leaf_id(path: str | None) -> str | None:
    if not path:
        return None
    build, deps = build_key_of(os.path.basename(os.path.dirname(path))), deps_key_of(os.path.basename(path))
    return maintenance.leaf_id(build, deps) if build and deps else None


def _show(out: Out, e: Any, kernel: str, nearest: Nearest | None) -> None:
    out.line((e.result, "ok" if e.result == "hit" else "warn"), f": {e.reason}")
    if e.path:
        out.line(("  file       ", "bold"), e.path)
    if e.leaf:
        leaf_id = _leaf_id(e.leaf)
        out.line(("  leaf       ", "bold"), f"{leaf_id}  {e.leaf}" if leaf_id else e.leaf)
    out.line(("  build key  ", "bold"), e.build_key)
    if e.miss is not Miss.ABSENT:
        return
    if nearest is None:
        out.line(("  nearest    ", "bold"), f"no other build of {kernel} in this cache (same tenant and backend)")
        return
    n = nearest
    out.line(("  nearest    ", "bold"), f"{n.info.id}, built {ago(n.manifest.created)} ago ({n.info.path})")
    for i, d in enumerate(n.differs):
        out.line((f"  {'differs' if i == 0 else '':<11}", "bold"), d.detail)


def _json(e: Any, kernel: str, nearest: Nearest | None) -> dict[str, object]:
    return {
        "result": e.result,
        "reason": e.reason,
        "miss": e.miss.value if e.miss is not None else None,
        "kernel": kernel,
        "build_key": e.build_key,
        "path": e.path,
        "leaf": e.leaf,
        "leaf_id": _leaf_id(e.leaf),
        "nearest": None
        if nearest is None
        else {
            "id": nearest.info.id,
            "path": nearest.info.path,
            "build_key": nearest.info.build_key,
            "created": nearest.manifest.created,
            "differs": [{"input": d.input, "detail": d.detail} for d in nearest.differs],
        },
    }
