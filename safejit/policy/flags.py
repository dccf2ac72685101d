"""The compiler flag policy: an allow-list, confined path flags, clean defines.

Flags that redirect output or dependency files, swap the driver or host
compiler, load plugins, or read response/spec files are refused with
:class:`~safejit.errors.FlagPolicyError`. Path-bearing flags are confined to
declared roots and rewritten in anchored form so they key location-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from ..errors import ConfigError, FlagPolicyError

__all__ = ["PATH_FLAGS", "check_defines", "check_flags"]

#: Flags whose value is a path; joined (``-I/x``) or separate (``-I /x``).
PATH_FLAGS: Final = ("-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-I")
#: Refused outright, with the reason given to the caller.
_REFUSED: Final = (
    ("-o", "redirects output"),
    ("-M", "writes dependency files"),
    ("-B", "swaps compiler programs"),
    ("-fplugin", "loads a plugin"),
    ("@", "reads a response file"),
    ("-specs", "reads a spec file"),
    ("--specs", "reads a spec file"),
    ("-ccbin", "swaps the host compiler"),
    ("--compiler-bindir", "swaps the host compiler"),
    ("-wrapper", "runs another program"),
    ("-save-temps", "writes files outside staging"),
    ("-dump", "writes files elsewhere"),
    ("-fdump", "writes files elsewhere"),
    ("-fopt-info", "writes files elsewhere"),
    ("-fprofile", "reads or writes profile files"),
    ("-fauto-profile", "reads a profile file"),
    ("-fuse-ld", "swaps the linker"),
    ("-fuse-linker-plugin", "loads the LTO plugin into the linker"),
    ("-fmodule-mapper", "runs a program or reads a mapper file"),
    ("-fpass-plugin", "loads a plugin"),
    ("-fmodule-file", "reads files elsewhere"),
    ("-fmodules-cache-path", "writes files elsewhere"),
    ("-fprebuilt-module-path", "reads files elsewhere"),
    ("-fmodule-map-file", "reads files elsewhere"),
    ("-fcrash-diagnostics-dir", "writes files elsewhere"),
    ("-ftime-trace", "writes files elsewhere"),
    ("-L", "adds library dirs whose contents are not tracked"),
    ("-fdeps-", "writes dependency files"),
    ("-fself-test", "reads files elsewhere"),
    ("-fdiagnostics-add-output", "writes files elsewhere"),
    ("-fdiagnostics-set-output", "writes files elsewhere"),
    ("-fsanitize-", "reads list files"),
    # At link time, once per partition, possibly in parallel: the assembler's list of
    # what it read (inline asm's .incbin) would hold one run's reads only.
    ("-flto", "assembles at link time, where what is read cannot be tracked"),
    ("-Wp,", "passes raw preprocessor options"),
    ("-Wa,", "passes raw assembler options"),
    ("-X", "passes raw options to a sub-tool"),
    ("--sysroot", "swaps the system root"),
    ("-isysroot", "swaps the system root"),
    ("-iprefix", "re-roots includes"),
    ("-iwithprefix", "re-roots includes"),
    ("-x", "changes the language"),
    ("-E", "changes the output kind"),
    ("-S", "changes the output kind"),
    ("-c", "changes the output kind"),
    ("-###", "prints instead of compiling"),
    ("--output", "redirects output"),
    ("-odir", "redirects output"),
    ("--keep", "writes files elsewhere"),
    ("-keep", "writes files elsewhere"),
    ("-Xclang", "passes raw options"),
)
#: Allowed prefixes (after the refusals): optimisation, features, machine, warnings, language…
_ALLOWED: Final = (
    "-O",
    "-f",
    "-m",
    "-W",
    "-std=",
    "--std=",
    "-g",
    "-D",
    "-U",
    "-l",
    "-pthread",
    "-w",
    "-pedantic",
    "-ansi",
    "-shared",
    "-rdynamic",
    "-static-libgcc",
    "-static-libstdc++",
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Confiner = Callable[[str, str], str]  # (path, what) -> anchored token text


def check_flags(flags: Sequence[str], anchor_path: Confiner, *, extra_allowed: Iterable[str] = ()) -> tuple[str, ...]:
    """Validate ``flags``; return them with every path flag in anchored form."""
    allowed = (*_ALLOWED, *extra_allowed)
    out: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not isinstance(flag, str) or not flag or "\0" in flag or "\n" in flag:
            raise FlagPolicyError(f"flag {flag!r} is empty or holds NUL/newline", flag=str(flag))
        path_flag = next((p for p in PATH_FLAGS if flag.startswith(p)), None)
        if path_flag is not None:
            value = flag[len(path_flag) :]
            if not value:
                if i + 1 >= len(flags):
                    raise FlagPolicyError(f"{flag} needs a path", flag=flag)
                i += 1
                value = flags[i]
            out.append(path_flag + anchor_path(value, f"flag {path_flag}"))
        elif flag.startswith("-Wl,"):
            out.append(_check_linker(flag, anchor_path))
        elif flag in ("-D", "-U"):
            if i + 1 >= len(flags):
                raise FlagPolicyError(f"{flag} needs a value", flag=flag)
            i += 1
            out.append(_check_macro(flag, flags[i]))
        elif flag.startswith(("-D", "-U")):
            out.append(_check_macro(flag[:2], flag[2:]))
        else:
            _check_plain(flag, allowed)
            out.append(flag)
        i += 1
    return tuple(out)


def _check_macro(flag: str, value: object) -> str:
    """``-DNAME[=VALUE]`` / ``-UNAME``: a C identifier, no NUL or newline."""
    if not isinstance(value, str) or "\0" in value or "\n" in value or "\r" in value:
        raise FlagPolicyError(f"{flag} value {value!r} is not a clean string", flag=flag)
    name = value.split("=", 1)[0]
    if not _IDENT.match(name) or (flag == "-U" and "=" in value):
        raise FlagPolicyError(f"{flag}{value}: {name!r} is not a C identifier", flag=flag)
    return flag + value


def _check_plain(flag: str, allowed: tuple[str, ...]) -> None:
    for prefix, reason in _REFUSED:
        if flag == prefix or (flag.startswith(prefix) and (len(prefix) > 2 or prefix in ("-M", "@", "-B", "-L"))):
            raise FlagPolicyError(f"flag {flag!r} is refused: it {reason}", flag=flag, reason=reason)
    if flag.startswith("-l") and "/" in flag:
        raise FlagPolicyError(f"flag {flag!r} names a library by path", flag=flag, reason="path in -l")
    if not flag.startswith(allowed):
        raise FlagPolicyError(f"flag {flag!r} is not on the allow-list", flag=flag, reason="not allowed")


#: Linker options allowed in ``-Wl,``; those in _LINKER_VALUE take the next part as a value.
_LINKER_ALLOWED: Final = frozenset(
    {
        "--as-needed",
        "--no-as-needed",
        "--gc-sections",
        "--no-gc-sections",
        "--no-undefined",
        "-Bsymbolic",
        "-Bsymbolic-functions",
        "-E",
        "--export-dynamic",
        "-s",
        "--strip-all",
        "--strip-debug",
        "--enable-new-dtags",
        "--disable-new-dtags",
        "-O0",
        "-O1",
        "-O2",
        "--build-id",
        "--eh-frame-hdr",
        "--no-allow-shlib-undefined",
        "-z",
        "-rpath",
        "--rpath",
        "-soname",
        "--soname",
        "--exclude-libs",
        "--hash-style",
        "--icf",
        "--sort-common",
        "--warn-common",
        "--fatal-warnings",
        "-lm",
    }
)
#: What a linker option, or a value that is no path, may hold.
_LINKER_WORD: Final = re.compile(r"[A-Za-z0-9_.+=:${}-]+\Z")
_LINKER_VALUE: Final = frozenset({"-z", "-rpath", "--rpath", "-soname", "--soname", "--exclude-libs", "--hash-style"})


def _check_linker(flag: str, anchor_path: Confiner) -> str:
    """``-Wl,`` options from an allow-list (``-o``, maps, plugins, scripts are refused);
    path values are confined. The linker expands ``@file`` anywhere in its arguments
    (a response file: the assembler's depfile would do), so no part may start with
    ``@``, before or after a path is resolved; and a value is never another option."""
    parts = flag.split(",")[1:]
    out = []
    expect_value = False
    for part in parts:
        key, eq, value = part.partition("=")
        if part.startswith("@") or (expect_value and part.startswith("-")):
            raise FlagPolicyError(f"linker argument {part!r} is not allowed", flag=flag, reason="linker")
        if expect_value:
            expect_value = False
        elif key not in _LINKER_ALLOWED and not key.startswith("--build-id"):
            raise FlagPolicyError(f"linker option {part!r} is not on the allow-list", flag=flag, reason="linker")
        else:
            expect_value = not eq and key in _LINKER_VALUE
            if not eq:
                out.append(_linker_word(part, flag) if "/" not in part else _linker_path(part, flag, anchor_path))
                continue
        if "/" in (value if eq else part):
            out.append((key + "=" if eq else "") + _linker_path(value if eq else part, flag, anchor_path))
        else:
            out.append(_linker_word(part, flag))
    if expect_value:
        raise FlagPolicyError(f"linker option in {flag!r} needs a value", flag=flag, reason="linker")
    return ",".join(["-Wl", *out])


def _linker_word(part: str, flag: str) -> str:
    if not _LINKER_WORD.match(part):
        raise FlagPolicyError(f"linker argument {part!r} is not allowed", flag=flag, reason="linker")
    return part


def _linker_path(path: str, flag: str, anchor_path: Confiner) -> str:
    """The confined path, anchored. Resolved, it must still be one argument: a comma
    would split it in two (``x,@asm.d`` behind a symlink would be a response file)."""
    anchored = anchor_path(path, "linker path")
    if "," in anchored:
        raise FlagPolicyError(f"linker path {path!r} resolves to a name with a comma", flag=flag, reason="linker")
    return anchored


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
            text = str(value)
        elif value is False:
            text = "0"
        else:
            raise ConfigError(f"define {name} has a {type(value).__name__} value", name=name)
        if text is not None and ("\0" in text or "\n" in text or "\r" in text):
            raise ConfigError(f"define {name} value holds NUL or a newline", name=name)
        out.append((name, text))
    return tuple(sorted(out, key=lambda kv: kv[0]))
