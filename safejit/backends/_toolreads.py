"""What the tools other than the compiler read — the assembler (what inline asm names:
``.incbin``, ``.include``) and the linker (crt files, libraries, linker scripts) — from the
lists they write when asked (``-Wa,--MD``, ``-Wl,--dependency-file``), beyond what the
compiler's depfile names."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from typing import Final

from ..closure.depfiles import make_unescaped, parse_listing, parse_single_rule

__all__ = ["ASM_DEPFILE", "ASM_DEP_FLAG", "LD_DEPFILE", "LD_DEP_FLAG", "READ_LISTS", "read_lists", "tool_reads"]

#: Where the assembler lists what it read (relative to the work dir: ``-Wa,`` splits
#: its argument at commas, which a cache root's path may hold). A leading dot: no
#: kernel's depfile (``<name>.d``, a C identifier) can be this file.
ASM_DEPFILE = ".asm.d"
#: GNU as: list every file read (``.incbin``, ``.include``) in :data:`ASM_DEPFILE`.
ASM_DEP_FLAG = f"-Wa,--MD,{ASM_DEPFILE}"
#: Where the linker lists what it read: crt files, libraries, linker scripts.
LD_DEPFILE = ".ld.d"
#: GNU ld, lld: list every input file in :data:`LD_DEPFILE`.
LD_DEP_FLAG = f"-Wl,--dependency-file={LD_DEPFILE}"
#: The lists of files that tools other than the compiler read (an argv with the flag
#: has the file written), and how each is parsed: gas writes Make syntax and copies the
#: names that ``.file`` directives give verbatim (so its list must hold one rule), and
#: lists those names though it never reads them; a linker lists only what it opened.
READ_LISTS: Final = (
    (ASM_DEP_FLAG, ASM_DEPFILE, parse_single_rule, "assembler"),
    (LD_DEP_FLAG, LD_DEPFILE, parse_listing, "linker"),
)


def read_lists(workdir: str, argv: Sequence[str]) -> list[str]:
    """The lists of read files (:data:`READ_LISTS`) that ``argv`` has written in ``workdir``."""
    return [os.path.join(workdir, name) for flag, name, _, _ in READ_LISTS if flag in argv]


def tool_reads(
    workdir: str, deps: Sequence[str], lists: Mapping[str, bytes | None], link_inputs: Sequence[str] = ()
) -> dict[str, tuple[str, ...]]:
    """The files the assembler and the linker read beyond ``deps`` (the linker also
    beyond ``link_inputs``: the toolchain's own), by tool name, from their lists
    (``{path: bytes}``, ``None``: the tool wrote none). Left out: what lies in the
    work dir — the compiler's temporaries, the staged source, and the names ``.file``
    directives give (gas lists them too: the source's base name), which the
    assembler never reads. A relative name resolves in the work dir, the tools'
    working dir, unless ``..`` takes it out. A name the linker lists must be there
    (raw, as GNU ld writes it, or as Make reads it, as lld writes it), unless it is
    a temporary of the work dir. Raises ``ValueError`` when a list is missing or
    malformed ("what the linker read is unknown (...)")."""
    known = set(deps)
    reads: dict[str, tuple[str, ...]] = {}
    for path, given in lists.items():
        parse, tool = next((p, t) for _, name, p, t in READ_LISTS if name == os.path.basename(path))
        try:
            if given is None:
                raise ValueError(f"it wrote no {os.path.basename(path)}")
            names = parse(given.decode("utf-8", "surrogateescape"))
            if tool == "linker":
                names = [_linker_input(workdir, name) for name in names]
        except ValueError as exc:
            raise ValueError(f"what the {tool} read is unknown ({exc})") from None
        extra = []
        own = set(link_inputs) if tool == "linker" else set()
        for name in names:
            full = name if os.path.isabs(name) else os.path.join(workdir, name)
            if full in known or full in own or _in_workdir(workdir, full):
                continue
            known.add(full)
            extra.append(full)
        reads[tool] = tuple(extra)
    return reads


def _linker_input(workdir: str, name: str) -> str:
    full = name if os.path.isabs(name) else os.path.join(workdir, name)
    if os.path.lexists(full):
        return name
    unescaped = make_unescaped(name)
    if unescaped != name and os.path.lexists(
        unescaped if os.path.isabs(unescaped) else os.path.join(workdir, unescaped)
    ):
        return unescaped
    if os.path.isabs(name) and _in_workdir(workdir, name):
        return name  # the compiler's temporary object, gone since
    raise ValueError(f"it lists {name!r}, which is not there")


def _in_workdir(workdir: str, path: str) -> bool:
    """Whether ``path`` names a file in ``workdir`` (through a symlink out of it, or
    ``..``, it names what that leads to)."""
    own = workdir.rstrip("/") + "/"
    if path.startswith(own):
        parts = path[len(own) :].split("/")
        if "" not in parts and "." not in parts and ".." not in parts:
            # The usual name (a temporary, the source): no symlink below the work dir,
            # checked part by part — what realpath would do from the filesystem root.
            below = own[:-1]
            for part in parts:
                below += "/" + part
                try:
                    if stat.S_ISLNK(os.lstat(below).st_mode):
                        return False
                except OSError:
                    return True  # gone (a temporary): nothing further down exists either
            return True
    norm = os.path.normpath(path)
    if not (norm == own[:-1] or norm.startswith(own)):
        return False  # (what a linker lists: system files)
    real, real_own = os.path.realpath(path), os.path.realpath(workdir).rstrip("/")
    return real == real_own or real.startswith(real_own + "/")
