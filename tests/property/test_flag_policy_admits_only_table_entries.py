"""The flag policy admits nothing but its tables' entries, and fails only with its
typed errors: on any text, a flag it returns is an exact entry of the family's
table, a name whose joined value matches that name's grammar in full, a confined
path flag, a macro, a listed library, a -Wl, list of linker entries or a ptxas list
of ptxas entries — checked here against the tables, not by the policy's own code."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given

from safejit.errors import ConfigError, FlagPolicyError
from safejit.policy.flag_tables import FAMILIES, LINKER, LINKER_NEXT, PTXAS, Family
from safejit.policy.flags import check_flags

from .strategies import family_flags

_TOKEN = "\0s0\0/confined"
_MACRO = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=.*)?|-U[A-Za-z_][A-Za-z0-9_]*", re.S)
#: What the stub resolution of a machine-dependent flag gives (an exact gcc entry).
_RESOLVED = ("-mavx2", "-mtune=znver3")


def _anchor(path: str, what: str) -> str:
    return _TOKEN


def _machine(flags: tuple[str, ...]) -> tuple[str, ...]:
    return _RESOLVED


def _linker_entry(flag: str) -> bool:
    parts = flag.split(",")[1:]
    i, ok = 0, bool(parts)
    while ok and i < len(parts):
        if parts[i] in LINKER_NEXT:
            i += 1
            ok = i < len(parts) and LINKER_NEXT[parts[i - 1]].fullmatch(parts[i]) is not None
        else:
            ok = LINKER.admits(parts[i])
        i += 1
    return ok


def _is_entry(flag: str, fam: Family) -> bool:
    if flag in fam.options.exact or flag in _RESOLVED:
        return True
    if any(flag.startswith(n) and g.fullmatch(flag[len(n) :]) for n, g in fam.options.valued.items()):
        return True
    if any(flag == p + _TOKEN for p in fam.path_flags):
        return True
    if fam.macros and _MACRO.fullmatch(flag) and "\n" not in flag and "\0" not in flag:
        return True
    if flag.startswith("-l") and flag[2:] in fam.libraries:
        return True
    if fam.linker and flag.startswith("-Wl,"):
        return _linker_entry(flag)
    for name in fam.ptxas:
        if flag.startswith(name):
            value = flag[len(name) :]
            return all(PTXAS.admits(p) for p in (value.split(",") if fam.ptxas_lists else [value]))
    return False


@given(drawn=family_flags())
def test_admitted_flags_are_table_entries(drawn: tuple[str, list[Any]]) -> None:
    family, flags = drawn
    try:
        out = check_flags(flags, _anchor, family=family, machine=_machine)
    except (FlagPolicyError, ConfigError):
        return
    fam = FAMILIES[family]
    for flag in out:
        assert _is_entry(flag, fam), (family, flag)
        assert flag not in fam.machine
