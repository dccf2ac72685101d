"""Coverage-guided fuzzing of the compiler flag policy (run by hand).

    pip install atheris
    python fuzz/fuzz_flags.py -atheris_runs=1000000
    python fuzz/fuzz_flags.py corpus_dir/ -max_total_time=600

Each input is a family and a list of argv items (and defines). A crash is: any
exception other than FlagPolicyError / ConfigError; a flag returned that is not an
entry of the family's table (exact, or a name whose value matches its grammar, a
confined path flag, a macro, a listed library, a -Wl, or ptxas list of entries); a
machine-dependent flag passed on unresolved; or, for nvcc, an argv with text its
shell would act on.
"""

from __future__ import annotations

import re
import sys

import atheris

with atheris.instrument_imports():
    from safejit.backends.cuda.nvcc_shell import check_argv, defines_header, header_args, split_macros
    from safejit.errors import ConfigError, FlagPolicyError
    from safejit.policy.flag_tables import FAMILIES, LINKER, LINKER_NEXT, PTXAS, Family
    from safejit.policy.flags import check_defines, check_flags

_NAMES = sorted(FAMILIES)
_TOKEN = "\0s0\0/p"
_RESOLVED = ("-mavx2", "--param=l1-cache-size=32")
_MACRO = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=[^\0\n\r]*)?|-U[A-Za-z_][A-Za-z0-9_]*")
#: Table words the fuzzer may start an item from (a dictionary for it, in effect).
_WORDS = sorted(
    {e for f in FAMILIES.values() for e in (*f.options.exact, *f.options.valued, *f.machine, *f.path_flags)}
    | {*LINKER.exact, *LINKER.valued, *LINKER_NEXT, *PTXAS.exact, *PTXAS.valued, "-Wl,", "-Xptxas=", "-D", "-l"}
)


def _linker_ok(flag: str) -> bool:
    parts, i = flag.split(",")[1:], 0
    while i < len(parts):
        if parts[i] in LINKER_NEXT:
            if i + 1 >= len(parts) or not LINKER_NEXT[parts[i]].fullmatch(parts[i + 1]):
                return False
            i += 2
        elif LINKER.admits(parts[i]):
            i += 1
        else:
            return False
    return bool(parts)


def _entry(flag: str, fam: Family) -> bool:
    if flag in fam.options.exact or flag in _RESOLVED or any(flag == p + _TOKEN for p in fam.path_flags):
        return True
    if any(flag.startswith(n) and g.fullmatch(flag[len(n) :]) for n, g in fam.options.valued.items()):
        return True
    if (fam.macros and _MACRO.fullmatch(flag)) or (flag.startswith("-l") and flag[2:] in fam.libraries):
        return True
    if fam.linker and flag.startswith("-Wl,"):
        return _linker_ok(flag)
    for name in fam.ptxas:
        if flag.startswith(name):
            value = flag[len(name) :]
            return all(PTXAS.admits(p) for p in (value.split(",") if fam.ptxas_lists else [value]))
    return False


def _item(fdp: atheris.FuzzedDataProvider) -> str:
    kind = fdp.ConsumeIntInRange(0, 3)
    text = fdp.ConsumeUnicodeNoSurrogates(24) if kind != 3 else fdp.ConsumeUnicode(24)
    if kind == 0:
        return _WORDS[fdp.ConsumeIntInRange(0, len(_WORDS) - 1)] + text
    if kind == 1:
        return _WORDS[fdp.ConsumeIntInRange(0, len(_WORDS) - 1)]
    return text


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    family = _NAMES[fdp.ConsumeIntInRange(0, len(_NAMES) - 1)]
    flags = [_item(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5))]
    defines = {fdp.ConsumeUnicode(8): fdp.ConsumeUnicode(16) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    try:
        out = check_flags(flags, lambda p, w: _TOKEN, family=family, machine=lambda given: _RESOLVED)
        macros = check_defines(defines)
    except (FlagPolicyError, ConfigError):
        return
    fam = FAMILIES[family]
    for flag in out:
        if not _entry(flag, fam) or flag in fam.machine:
            raise AssertionError(f"{family} admitted {flag!r}")
    if family != "nvcc":
        return
    try:
        defines_header(out, macros)
    except FlagPolicyError:
        return
    others = split_macros(out, macros)[0]
    argv = ["nvcc", "--cubin", *header_args(out, macros), *others]
    expanded = [a.replace("\0s0\0", "/root").replace("{DEFINES}", "/w/.defines.h") for a in argv]
    check_argv(argv, expanded)  # raises FlagPolicyError: a crash here


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
