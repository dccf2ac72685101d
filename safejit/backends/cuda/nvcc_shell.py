"""What nvcc's shell may see.

nvcc runs its steps (the host preprocessor, cicc, ptxas) as command lines through
``/bin/sh -c``. It puts ``-D`` values and paths in double quotes, inside which ``$``,
backquotes, ``\\`` and ``"`` still act; it passes ptxas options unquoted; and it
splits option values at commas (``-DX=a,b`` defines ``X=a`` and ``b``). So a define
value ``$(cmd)`` ran ``cmd``, and so would a path holding one.

Hence: a macro whose value is made of :data:`_PLAIN` characters only (none of which
acts inside double quotes, and no comma) goes on the command line as usual; the
first one that is not, and every macro after it (order matters: ``-D`` then ``-U``),
is written into a header of the compile's work dir, ``-include``\\ d — text the
preprocessor reads, which no shell ever sees. That header's bytes are a function of
the spec's ``flags`` and ``defines``, so the key covers them. It is included after
nvcc's own ``cuda_runtime.h``, so such a macro does not reach that header. Every other
argument must be made of :data:`_SAFE` characters once the roots are put in
(:func:`check_argv`); a path that is not is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from ...errors import FlagPolicyError
from .._argv import DEFINES_SLOT

__all__ = ["check_argv", "defines_header", "header_args", "split_macros"]

#: What a macro value on nvcc's command line may hold: nothing the shell interprets
#: inside double quotes ($ ` \\ "), no comma (nvcc splits there), no quote at all.
_PLAIN: Final = re.compile(r"[A-Za-z0-9_ .+*/%()<>=!&|^~:?\[\]{}-]*\Z")
_MACRO: Final = re.compile(r"-[DU][A-Za-z_][A-Za-z0-9_]*(?:=(.*))?\Z", re.S)
#: What any other argument may hold once the roots are put in, commas aside (a table's
#: list, -Xptxas=-v,-O3; but a path put in must add none).
_SAFE: Final = re.compile(r"[A-Za-z0-9_./+=@%:~-]*\Z")


def _macro_args(flags: Sequence[str], defines: Sequence[tuple[str, str | None]]) -> list[str]:
    """Every macro in the order the compiler would take it: ``-D``/``-U`` flags, then defines."""
    return [f for f in flags if f.startswith(("-D", "-U"))] + [
        f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines
    ]


def split_macros(
    flags: Sequence[str], defines: Sequence[tuple[str, str | None]]
) -> tuple[list[str], list[str], list[str]]:
    """``(other flags, macros for the command line, macros for the header)``."""
    macros = _macro_args(flags, defines)
    cut = next((i for i, m in enumerate(macros) if not _plain(m)), len(macros))
    return [f for f in flags if not f.startswith(("-D", "-U"))], macros[:cut], macros[cut:]


def defines_header(flags: Sequence[str], defines: Sequence[tuple[str, str | None]]) -> bytes | None:
    """The bytes of the work dir's defines header for these flags and defines; None
    when every macro goes on the command line."""
    lines = []
    for macro in split_macros(flags, defines)[2]:
        name, eq, value = macro[2:].partition("=")
        if macro.startswith("-U"):
            lines.append(f"#undef {name}\n")
            continue
        if value.endswith(("\\", "??/")) or "/*" in value:
            # A continued line or an open comment would run into the next definition;
            # on the command line each definition is a text of its own.
            raise FlagPolicyError(
                f"define {name}: a value that ends in a backslash or opens a comment is refused for nvcc",
                flag=macro,
                reason="nvcc shell",
            )
        lines.append(f"#define {name} {value if eq else '1'}\n")
    return "".join(lines).encode() if lines else None


def _plain(macro: str) -> bool:
    m = _MACRO.match(macro)
    return m is not None and _PLAIN.match(m.group(1) or "") is not None


def header_args(flags: Sequence[str], defines: Sequence[tuple[str, str | None]]) -> list[str]:
    """The command line's macros, then the header's ``-include`` when there is one."""
    _, plain, rest = split_macros(flags, defines)
    return [*plain, *(("-include", DEFINES_SLOT) if rest else ())]


def check_argv(templates: Sequence[str], argv: Sequence[str]) -> None:
    """Refuse an argument nvcc's shell could act on: ``argv`` is ``templates`` with the
    roots and the work dir put in (the program itself, run directly, aside)."""
    for template, arg in zip(templates[1:], argv[1:], strict=True):
        if template == arg and template.startswith(("-D", "-U")):
            ok = _plain(arg)
        elif "\0" in template or template != arg:
            # An anchored path (after a table's option: -I, -Xcompiler=-iquote,) or a slot
            # (the work dir's files): the path is plain, commas aside (nvcc splits there).
            cut = template.find("\0") if "\0" in template else 0
            ok = _SAFE.match(template[:cut].replace(",", "")) is not None and _SAFE.match(arg[cut:]) is not None
        else:
            ok = _SAFE.match(arg.replace(",", "")) is not None
        if not ok:
            raise FlagPolicyError(
                f"{arg!r} holds characters nvcc's shell would act on (a root or path with $, `, quotes, "
                "spaces, commas...): refused for nvcc",
                flag=template.replace("\0", ""),
                reason="nvcc shell",
            )
