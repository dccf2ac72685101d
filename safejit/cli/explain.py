"""``safejit explain SOURCE``: would a compile hit, and if not, why — and, when no leaf
has this build key, which input differs from the nearest other build of the same
kernel (``Manifest.inputs``: source, flags, defines, include dirs, extras,
environment, arch, toolchain)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..cache import maintenance
from ..cache.layout import build_key_of, deps_key_of
from ..outcomes import Miss
from ..runtime import Explanation, Runtime
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, ago, cache_roots, config_for
from ._out import Out

__all__ = ["cmd_explain"]


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
        source = rt.source(args.source, name=args.name)
        explanation = rt.explain(source, **kwargs)
    if args.json:
        out.json(_json(explanation, source.name))
    else:
        _show(out, explanation, source.name)
    return EXIT_OK if explanation.result == "hit" else EXIT_FINDINGS


def _leaf_id(path: str | None) -> str | None:
    if not path:
        return None
    build, deps = build_key_of(os.path.basename(os.path.dirname(path))), deps_key_of(os.path.basename(path))
    return maintenance.leaf_id(build, deps) if build and deps else None


def _show(out: Out, e: Explanation, kernel: str) -> None:
    out.line((e.result, "ok" if e.result == "hit" else "warn"), f": {e.reason}")
    if e.path:
        out.line(("  file       ", "bold"), e.path)
    if e.leaf:
        leaf_id = _leaf_id(e.leaf)
        out.line(("  leaf       ", "bold"), f"{leaf_id}  {e.leaf}" if leaf_id else e.leaf)
    out.line(("  build key  ", "bold"), e.build_key)
    if e.miss is not Miss.ABSENT:
        return
    n = e.nearest
    if n is None:
        out.line(("  nearest    ", "bold"), f"no other build of {kernel} in this cache (same tenant and backend)")
        return
    out.line(("  nearest    ", "bold"), f"{n.id}, built {ago(n.created)} ago ({n.leaf})")
    for i, d in enumerate(n.differs):
        out.line((f"  {'differs' if i == 0 else '':<11}", "bold"), d.detail)


def _json(e: Explanation, kernel: str) -> dict[str, object]:
    n = e.nearest
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
        if n is None
        else {
            "id": n.id,
            "path": n.leaf,
            "build_key": n.build_key,
            "created": n.created,
            "differs": [{"input": d.input, "detail": d.detail} for d in n.differs],
        },
    }
