"""A compiler's log in the user's terms: the scratch copy of the source and the work dir
named as the user knows them, a file it could not open said alike whether it is there
or refused (an error must not say whether a file outside the roots exists), and where
such a file was looked for."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Final

from ..closure.anchors import Anchors
from ..errors import CompileError
from ..spec import BuildSpec
from .base import CompileContext

__all__ = [
    "AS_UNREAD",
    "display_paths",
    "in_user_terms",
    "searched_note",
    "source_as_known",
    "source_path",
    "unread_alike",
    "unread_names",
    "user_paths",
]


def source_path(workdir: str, spec: BuildSpec) -> str:
    """Where the source's scratch copy lies in ``workdir``."""
    return os.path.join(workdir, "src", spec.filename)


def display_paths(ctx: CompileContext) -> tuple[tuple[str, str], ...]:
    """How a compiler's messages name the scratch copy of the source and the work dir,
    and what to say instead: the source as the user knows it (its origin, for a file
    read through ``Runtime.source``/``Source.from_file``; else its file name), and
    nothing of the work dir (``<work dir>/x.so`` says ``x.so``)."""
    spec, workdir = ctx.spec, ctx.workdir.rstrip("/")
    shown = source_as_known(ctx)
    return (
        (source_path(workdir, spec), shown),
        (f"./src/{spec.filename}", shown),  # (as -fdebug-prefix-map has debug info name it)
        (workdir + "/", ""),
        (workdir, "."),
    )


def source_as_known(ctx: CompileContext) -> str:
    """The source as the user knows it: its origin, for a file read through
    ``Runtime.source``/``Source.from_file``; else its file name."""
    spec = ctx.spec
    if spec.quote_dir is not None:
        origin_dir = ctx.expand(Anchors.token(*spec.quote_dir))
        if origin_dir and "\0" not in origin_dir:
            return os.path.join(origin_dir, spec.filename)
    return spec.filename


def user_paths(text: str, shown: Sequence[tuple[str, str]]) -> str:
    """``text`` (a compiler's log) with the scratch paths of :func:`display_paths` replaced."""
    if not shown or (shown[-1][0] not in text and shown[1][0] not in text):
        return text
    for scratch, user in shown:
        text = text.replace(scratch, user)
    return text


#: A compiler's (or the assembler's, for .include) word for a file it could not open: under
#: Landlock "Permission denied" is what a file outside the roots gives, "No such file or
#: directory" one that is not there.
_UNREAD: Final = re.compile(
    r"^(.*\b(?:fatal error: .+?|Error: can't open .+? for reading)): (?:Permission denied|No such file or directory)$",
    re.M,
)


#: GNU as's words for a file an ``.incbin`` or ``.include`` names that it could not open.
AS_UNREAD: Final = re.compile(r"\bError: (?:file not found: (.+)|can't open (.+?) for reading: .*)$", re.M)

#: What :func:`unread_alike` made of a file the compiler could not open: ``<includer>:<line>:<col>:`` or
#: ``<program>:``, then the name as the directive spelt it.
_UNREAD_NAME: Final = re.compile(
    r"^(?:(/[^:\n]*):\d+:\d+: )?.*?\bfatal error: (.+?): not found \(or outside the declared roots\)$", re.M
)


def unread_names(log: str, search_dirs: Sequence[str], system: Sequence[str] = ()) -> list[str]:
    """Where the files a compiler's ``log`` says it could not open were looked for: an
    absolute name as written (a file found is named so); a relative one next to its
    includer and in each search directory, in order (where one climbs out with ``..``,
    or through a link to a missing target or a directory outside, is what a file there
    would have been refused as) — but for a ``..`` name, not from the toolchain's own
    dirs (``system``: where a missing ``../config.h`` looked is no lookup of the tenant's,
    as record_closure does not record it)."""
    names = []
    toolchain = set(system)
    for m in _UNREAD_NAME.finditer(log):
        includer, name = m.group(1), m.group(2)
        if name.startswith("/"):
            names.append(name)
            continue
        climbs = ".." in name.split("/")
        dirs = [os.path.dirname(includer)] if includer else []
        dirs += [d for d in search_dirs if not (climbs and d in toolchain)]
        names += [os.path.join(d, name) for d in dirs]
    return names


def searched_note(log: str, search_dirs: Sequence[str]) -> str:
    """What to add to a failed compile's message whose ``log`` says a file was not found:
    the include dirs searched, in order (the user's own and the toolchain's: nothing of
    what is there)."""
    if _UNREAD_NAME.search(log) is None:
        return ""
    listed = "\n".join(f"  {d}" for d in search_dirs) or "  (none)"
    gap = "" if log.endswith("\n") else "\n"
    return f"{gap}include dirs searched, in order (a quoted name first beside its includer):\n{listed}"


def unread_alike(log: str) -> str:
    """``log`` saying the same of a file it could not open whether it is there or not: told
    apart, a compile error would say whether any file outside the roots exists."""
    return _UNREAD.sub(r"\1: not found (or outside the declared roots)", log)


def in_user_terms(exc: CompileError, shown: Sequence[tuple[str, str]]) -> CompileError:
    attrs = dict(exc._attrs)
    if isinstance(attrs.get("log"), str):
        attrs["log"] = user_paths(attrs["log"], shown)
    return type(exc)(user_paths(exc.message, shown), **attrs)
