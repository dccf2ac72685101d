"""``safejit inspect LEAF``: what a leaf holds — its manifest, the inputs its build
key was made of, and the files its build read (summarised per anchor; ``--deps``
lists them all)."""

from __future__ import annotations

import argparse
import os
import re
import textwrap
import time
from collections import Counter
from collections.abc import Iterable
from typing import Final

import msgspec

from ..cache import maintenance
from ..cache.fsio import read_bytes
from ..cache.layout import MANIFEST, MARKER, build_key_of, deps_key_of
from ..cache.leaf import MANIFEST_LIMIT, Manifest, ManifestError, decode_manifest
from ..config import Config
from ._common import EXIT_FINDINGS, EXIT_OK, CliError, Finding, ago, cache_roots, show_findings, size_text
from ._out import Out

__all__ = ["ANCHORS_HELP", "cmd_inspect", "find_leaf"]

#: What the anchors of a dependency (``s0``, ``t3``...) stand for.
ANCHORS_HELP: Final = (
    ("s", "source roots, in the order declared (s0 = the first of Config.source_roots / SAFEJIT_SOURCE_ROOTS)"),
    ("t", "the toolchain's roots: its install prefix and the system header dirs it searches"),
    ("l", "the linker's library dirs"),
    ("c", "cache roots"),
)
#: Dependencies and absent paths shown without ``--deps``.
_FIRST: Final = 5
_HEX: Final = re.compile(r"[0-9a-f]{4,128}\Z")
_TOKEN: Final = re.compile("\0([a-z][0-9]+)\0")


def find_leaf(arg: str, roots: Iterable[str]) -> tuple[str, str]:
    """``(path, id)`` of the leaf ``arg`` names: a leaf (or one-leaf build) directory,
    or a prefix of a leaf's short id or build key (at least 4 hex digits) or of its deps
    key (more than 8: a shorter one reads as an id or a build key).
    ``CliError`` when none or several match."""
    if os.path.lexists(arg):
        return _leaf_dir(arg)
    prefix = arg.strip().lower()
    if not _HEX.match(prefix):
        raise CliError(
            f"{arg}: neither a leaf directory nor a leaf id",
            "an id is the ID column of `safejit ls` (or a prefix of a build key, 4 hex digits or more, "
            "or of a deps key, more than 8: a shorter one reads as an id)",
        )
    matches = [
        info
        for root in roots
        for info in maintenance.iter_leaves(root)
        if info.id.startswith(prefix)
        or info.build_key.startswith(prefix)
        or (len(prefix) > maintenance.ID_BUILD and info.deps_key.startswith(prefix))
    ]
    if not matches:
        raise CliError(f"no leaf has the id {arg}", "`safejit ls` lists the ids (add --cache-dir for another cache)")
    if len(matches) > 1:
        shown = [f"{m.id}  {m.path}" for m in matches[:20]]
        more = [f"… and {len(matches) - 20} more"] if len(matches) > 20 else []
        raise CliError(f"the id {arg} is ambiguous: {len(matches)} leaves match", *shown, *more, "give more digits")
    return matches[0].path, matches[0].id


def _leaf_dir(arg: str) -> tuple[str, str]:
    path = os.path.abspath(arg)
    name = os.path.basename(path)
    if build_key_of(name) is not None:  # a build dir: its leaf, when it has one
        leaves = sorted(e for e in _names(path) if deps_key_of(e) is not None)
        if len(leaves) != 1:
            raise CliError(f"{arg} is a build directory with {len(leaves)} leaves; name one of them", *leaves[:20])
        path, name = os.path.join(path, leaves[0]), leaves[0]
    build, deps = build_key_of(os.path.basename(os.path.dirname(path))), deps_key_of(name)
    return path, maintenance.leaf_id(build, deps) if build and deps else ""


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror}") from None


def cmd_inspect(args: argparse.Namespace, out: Out) -> int:
    path, leaf_id = find_leaf(args.leaf, cache_roots(args.cache_dir).dirs)
    try:
        man = decode_manifest(read_bytes(os.path.join(path, MANIFEST), MANIFEST_LIMIT))
    except (OSError, ManifestError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        finding = Finding("leaf", path, "manifest", f"the manifest cannot be read: {detail}", leaf_id)
        if args.json:
            out.json({"id": leaf_id or None, "path": path, "manifest": None, "findings": [finding.as_json()]})
        else:
            show_findings(out, [finding])
        return EXIT_FINDINGS
    try:
        extra = sorted(set(os.listdir(path)) - {MANIFEST, MARKER, man.artifact_file})
    except OSError:
        extra = []
    here = _source_roots_here()
    if args.json:
        out.json(
            {
                "id": leaf_id or None,
                "path": path,
                "manifest": msgspec.to_builtins(man),
                "other_files": extra,
                "deps_by_anchor": dict(Counter(d[0] for d in man.deps)),
                "negatives_by_anchor": dict(Counter(n[0] for n in man.negatives)),
                "source_roots_here": here,
                "findings": [],
            }
        )
        return EXIT_OK
    _summary(out, man, path, leaf_id, extra)
    _closure(out, man, full=args.deps)
    _anchors(out, man, here)
    return EXIT_OK


def _summary(out: Out, man: Manifest, path: str, leaf_id: str, extra: list[str]) -> None:
    version = (man.toolchain.get("version", "").splitlines() or [""])[0]
    rows = [
        ("leaf", f"{leaf_id}  {path}" if leaf_id else path),
        ("kernel", f"{man.name}  (tenant {man.tenant}, backend {man.backend})"),
        ("symbols", ", ".join(man.kernels) or "-"),
        ("build key", man.build_key),
        ("deps key", man.deps_key),
        ("artifact", f"{man.artifact_file}, {size_text(man.artifact_size)}, digest {man.artifact_digest[:16]}"),
        ("compiler", f"{man.toolchain.get('compiler', '?')}  {version}".rstrip()),
        ("created", f"{time.ctime(man.created)} ({ago(man.created)} ago)"),
        ("timings", ", ".join(f"{k} {v:.3f}" for k, v in sorted(man.timings.items())) or "-"),
        ("signed", f"yes ({man.signature.alg}, key {man.signature.key_id})" if man.signature else "no"),
        *(_inputs(man)),
        ("other files", ", ".join(extra) or "-"),
    ]
    for label, value in rows:
        out.line((f"{label:<13}", "bold"), value)
    argv = " ".join(_TOKEN.sub(lambda m: "{" + m.group(1) + "}", a) for a in man.argv)
    wrapped = textwrap.wrap(argv, max(20, out.width - 12), break_long_words=False, break_on_hyphens=False)
    for n, line in enumerate(wrapped or ["-"]):
        out.line((f"{'argv' if n == 0 else '':<13}", "bold"), line)


def _inputs(man: Manifest) -> list[tuple[str, str]]:
    i = man.inputs
    if i is None:
        return [("inputs", "not recorded (a leaf from an older safejit)")]
    defines = ", ".join(k if v is None else f"{k}={v}" for k, v in i.defines)
    return [
        ("source", f"digest {i.source_digest[:16]}, language {i.language}, arch {i.arch or '-'}"),
        ("flags", " ".join(_TOKEN.sub(lambda m: "{" + m.group(1) + "}", f) for f in i.flags) or "-"),
        ("defines", defines or "-"),
        ("include dirs", ", ".join(f"{a}/{r}" if r != "." else a for a, r in i.include_dirs) or "-"),
        ("extras", ", ".join(f"{k}={v}" for k, v in i.extras) or "-"),
        ("environment", ", ".join(f"{k} (value digest {d[:12]})" for k, d in i.env) or "-"),
    ]


def _closure(out: Out, man: Manifest, *, full: bool) -> None:
    for title, items in (("dependencies", man.deps), ("must not exist", man.negatives)):
        per = Counter(item[0] for item in items)
        counts = ", ".join(f"{a} {n}" for a, n in sorted(per.items(), key=_anchor_order))
        out.line((f"{title}: {len(items)}", "bold"), f"  ({counts})" if counts else "")
        shown = items if full else items[:_FIRST]
        rows = [(item[0], item[1], item[2][:12] if len(item) > 2 else "") for item in shown]
        if rows and full:
            for anchor, rel, digest in rows:  # (the whole path: a list to copy from, not a table)
                out.line(f"  {anchor:<4} {digest:<12}  {rel}")
        elif rows:
            out.table(("ANCHOR", "PATH", "DIGEST"), rows, shrink={1}, middle={1})
        if len(items) > len(shown):
            out.line((f"  … {len(items) - len(shown)} more (--deps lists them all)", "dim"))


def _anchor_order(item: tuple[str, int]) -> tuple[str, int]:
    name = item[0]
    return (name[:1], int(name[1:]) if name[1:].isdigit() else 0)


def _anchors(out: Out, man: Manifest, here: dict[str, str]) -> None:
    used = {d[0][:1] for d in man.deps} | {n[0][:1] for n in man.negatives}
    out.line(("anchors", "bold"), "  (paths are kept relative to a root, so another checkout or install hits)")
    for letter, meaning in ANCHORS_HELP:
        if letter in used:
            out.line(f"  {letter}*  {meaning}")
    for name, root in here.items():
        out.line(f"  {name} here: {root}")


def _source_roots_here() -> dict[str, str]:
    """``s<i>`` → the source root it names with this environment's configuration."""
    try:
        roots = Config.from_env().source_roots
    except Exception:  # (a bad SAFEJIT_* variable: inspecting a leaf does not need it)
        return {}
    return {f"s{i}": os.path.realpath(os.path.expanduser(r)) for i, r in enumerate(roots)}
