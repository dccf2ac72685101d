"""The compiler flag policy: exact tables per compiler family, confined path flags,
clean defines.

Each flag must be an entry of its family's table (:mod:`.flag_tables`): an exact
spelling, or a name whose joined value matches that name's grammar in full.
Anything else is refused with :class:`~safejit.errors.FlagPolicyError` naming the
flag and why. Path-bearing flags are confined to declared roots and rewritten in
anchored form so they key location-free. Machine-dependent flags (``-march=native``)
are replaced by what the backend resolves them to on this machine, so that the key
holds what they mean here.

Example::

    from safejit.policy.flags import check_flags
    check_flags(["-O3", "-I", "/opt/lib/include"], anchor, family="gcc")
    # -> ("-O3", "-I\\0s0\\0/include")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ..errors import ConfigError, FlagPolicyError
from .flag_tables import LINKER, LINKER_NEXT, LINKER_REASONS, PTXAS, REASONS, Family, family

__all__ = ["PATH_FLAGS", "MachineResolver", "check_defines", "check_flags"]

#: Flags whose value is a path (the host family's; each family lists its own).
PATH_FLAGS: Final = ("-isystem", "-iquote", "-idirafter", "-include", "-I")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Confiner = Callable[[str, str], str]  # (path, what) -> anchored token text
#: The machine-dependent flags given (in order) -> what they resolve to here.
MachineResolver = Callable[[tuple[str, ...]], Sequence[str]]


def check_flags(
    flags: Sequence[str], anchor_path: Confiner, *, family: str, machine: MachineResolver | None = None
) -> tuple[str, ...]:
    """Validate ``flags`` against ``family``'s table; return them with every path flag in
    anchored form and the machine-dependent ones replaced by ``machine``'s resolution
    (without ``machine``, such a flag is refused)."""
    fam = _family(family)
    out: list[str] = []
    found_machine: list[str] = []
    at = -1  # where the resolution goes: in place of the first machine-dependent flag
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not _clean(flag):
            raise FlagPolicyError(
                f"flag {flag!r} is empty, holds NUL or a newline, or is not UTF-8", flag=repr(flag), reason="malformed"
            )
        path_flag = next((p for p in fam.path_flags if flag.startswith(p)), None)
        if path_flag is not None or (fam.macros and flag in ("-D", "-U")):
            joined = flag[len(path_flag or flag) :]
            i += not joined  # (the value is the next item)
            value = joined or _separate_value(flags, i, flag)
            out.append(_check_macro(flag, value) if path_flag is None else _path(flag, path_flag, value, anchor_path))
        elif fam.macros and flag.startswith(("-D", "-U")):
            out.append(_check_macro(flag[:2], flag[2:]))
        elif flag in fam.machine:
            if machine is None:
                raise FlagPolicyError(
                    f"flag {flag!r} depends on the machine and cannot be resolved here", flag=flag, reason="machine"
                )
            at = len(out) if at < 0 else at
            found_machine += [] if flag in found_machine else [flag]
        else:
            out.append(_check_option(flag, fam))
        i += 1
    if found_machine and machine is not None:
        out[at:at] = _resolution(tuple(found_machine), machine(tuple(found_machine)), fam)
    return tuple(out)


def _path(flag: str, path_flag: str, value: str, anchor_path: Confiner) -> str:
    """``path_flag`` and its confined, anchored path ``value`` (from ``flag`` or the next item)."""
    if value.startswith("-"):
        raise FlagPolicyError(f"{path_flag} {value!r}: an option where a path belongs", flag=flag)
    return path_flag + anchor_path(value, f"flag {path_flag}")


def _family(name: str) -> Family:
    try:
        return family(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _separate_value(flags: Sequence[str], i: int, flag: str) -> str:
    if i >= len(flags):
        raise FlagPolicyError(f"{flag} needs a value", flag=flag, reason="malformed")
    value = flags[i]
    if not _clean(value):
        raise FlagPolicyError(f"{flag} value {value!r} is not a clean string", flag=flag, reason="malformed")
    return value


def _clean(text: object) -> bool:
    """A non-empty str without NUL or a line break that encodes to UTF-8 (a lone
    surrogate would fail only when the argv is encoded, as a UnicodeEncodeError)."""
    if not isinstance(text, str) or not text or "\0" in text or "\n" in text or "\r" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_macro(flag: str, value: str) -> str:
    """``-DNAME[=VALUE]`` / ``-UNAME``: a C identifier (the value is clean already)."""
    name = value.split("=", 1)[0]
    if not _IDENT.match(name) or (flag == "-U" and "=" in value):
        raise FlagPolicyError(f"{flag}{value}: {name!r} is not a C identifier", flag=flag, reason="macro")
    return flag + value


def _check_option(flag: str, fam: Family) -> str:
    if fam.options.admits(flag):
        return flag
    if fam.linker and flag.startswith("-Wl,"):
        return _check_linker(flag)
    if fam.libraries and flag.startswith("-l") and flag[2:] in fam.libraries:
        return flag
    ptxas = next((p for p in fam.ptxas if flag.startswith(p)), None)
    if ptxas is not None:
        value = flag[len(ptxas) :]
        for opt in value.split(",") if fam.ptxas_lists else [value]:
            if not PTXAS.admits(opt):
                raise FlagPolicyError(f"ptxas option {opt!r} in {flag!r} is not allowed", flag=flag, reason="ptxas")
        return flag
    raise FlagPolicyError(f"flag {flag!r} is refused: it {_reason(flag, fam)}", flag=flag, reason=_reason(flag, fam))


def _reason(flag: str, fam: Family) -> str:
    known = max((p for p in REASONS if flag.startswith(p)), key=len, default=None)
    if known is not None:
        return REASONS[known]
    if not fam.path_flags and flag.startswith(("-I", "-isystem", "-iquote", "-idirafter", "-include")):
        return f"is a path flag, which {fam.name} takes none of: pass search dirs as include_dirs="
    return f"is not on the {fam.name} allow-list (docs/security.md, 'Flag policy')"


def _resolution(given: tuple[str, ...], resolved: Sequence[str], fam: Family) -> list[str]:
    """What the machine-dependent flags resolved to: plain entries of the table (so the
    same build can be asked for by hand, and keys the same)."""
    out = []
    for flag in resolved:
        if not isinstance(flag, str) or flag in fam.machine or not fam.options.admits(flag):
            raise FlagPolicyError(
                f"{' '.join(given)} resolves to {flag!r} here, which is not on the {fam.name} allow-list",
                flag=given[0],
                reason="machine",
            )
        out.append(flag)
    return out


def _check_linker(flag: str) -> str:
    """``-Wl,`` options, each from :data:`~.flag_tables.LINKER` (``-z`` and
    ``--exclude-libs`` with their value in the next part). No option takes a path, so
    nothing the linker is given can name a file: neither an output, a script, a
    library dir nor a response file (``@file``, which the linker expands anywhere)."""
    parts = flag.split(",")[1:]
    i = 0
    while i < len(parts):
        part = parts[i]
        grammar = LINKER_NEXT.get(part)
        if grammar is not None:
            i += 1
            value = parts[i] if i < len(parts) else ""
            if not grammar.fullmatch(value):
                raise _linker_refusal(flag, f"{part} {value}".strip(), value or part)
        elif not LINKER.admits(part):
            raise _linker_refusal(flag, part, part.partition("=")[0])
        i += 1
    if not parts:
        raise FlagPolicyError(f"{flag!r} passes nothing to the linker", flag=flag, reason="linker")
    return flag


def _linker_refusal(flag: str, part: str, key: str) -> FlagPolicyError:
    known = max((p for p in LINKER_REASONS if key.startswith(p)), key=len, default=None)
    why = LINKER_REASONS[known] if known is not None else "is not on the linker allow-list"
    return FlagPolicyError(f"linker option {part!r} in {flag!r} is refused: it {why}", flag=flag, reason="linker")


def check_defines(defines: Mapping[str, object] | None) -> tuple[tuple[str, str | None], ...]:
    """Sorted ``(name, value)``; names are C identifiers, values carry no NUL or newline."""
    if not defines:
        return ()
    out: list[tuple[str, str | None]] = []
    for name, value in defines.items():
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ConfigError(f"define name {name!r} is not a C identifier", name=str(name))
        if value is None or value is True:
            text = None if value is None else "1"
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            try:
                text = str(value)
            except ValueError:  # (an int past Python's limit on digits written)
                raise ConfigError(f"define {name} is an int too large to write", name=name) from None
        elif value is False:
            text = "0"
        else:
            raise ConfigError(f"define {name} has a {type(value).__name__} value", name=name)
        if text is not None and text and not _clean(text):
            raise ConfigError(f"define {name} value holds NUL or a newline, or is not UTF-8", name=name)
        out.append((name, text))
    return tuple(sorted(out, key=lambda kv: kv[0]))
