"""What machine-dependent flags (``-march=native``) mean on this machine.

gcc's driver resolves ``-march=native`` itself, into the options it hands its
compiler proper (``cc1``): the CPU by name, every instruction set extension on or off
(``-mavx512f``, ``-mno-amx-tile``) and the cache sizes (``--param=l1-cache-size=32``).
``cc -###`` prints that command line without running it; what the native flags add
to it (compared with the same line without them) is their meaning here. Those
options replace the native flags in the argv, so the argv — and the build key — says
what was built, and a cache shared between nodes never hands one CPU's build to
another. clang passes its resolution as ``-cc1`` target features, which have no
driver spelling: a compiler whose ``-###`` shows no ``cc1`` is refused.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from ..errors import FlagPolicyError
from .base import Runner

__all__ = ["cc1_options", "resolve_native"]

#: The compilers proper whose command line gcc's driver prints with ``-###``.
_CC1: frozenset[str] = frozenset({"cc1", "cc1plus"})


def cc1_options(listing: str) -> list[str] | None:
    """The machine options (``-m…``, ``--param=…``) on the ``cc1`` line of a ``-###``
    listing, in order; None when it has no ``cc1`` line (clang: ``-cc1``)."""
    for line in listing.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if not words or os.path.basename(words[0]) not in _CC1:
            continue
        out: list[str] = []
        for i, word in enumerate(words):
            if word.startswith("-m"):
                out.append(word)
            elif word == "--param" and i + 1 < len(words):
                out.append(f"--param={words[i + 1]}")
            elif word.startswith("--param="):
                out.append(word)
        return out
    return None


def resolve_native(
    run: Runner, compiler: str, language: str, flags: Sequence[str], extra_read: Sequence[str] = ()
) -> tuple[str, ...]:
    """What ``flags`` (native ones: ``-march=native``…) add to ``compiler``'s ``cc1``
    line for ``language`` on this machine. Raises :class:`FlagPolicyError` when the
    compiler does not show it (clang), or shows nothing for them."""
    base = [compiler, "-###", "-c", "-x", language, "/dev/null", "-o", "/dev/null"]
    lines = []
    for argv in (base, [*base[:2], *flags, *base[2:]]):
        result = run(argv, cwd="", timeout=60, extra_read=extra_read)
        lines.append(cc1_options(result.log) if result.returncode == 0 else None)
    plain, native = lines
    if plain is None or native is None:
        raise FlagPolicyError(
            f"{' '.join(flags)}: {compiler} does not show what it means on this machine (only gcc's driver "
            "does); name the CPU instead (-march=<cpu>)",
            flag=flags[0],
            reason="machine",
        )
    seen = set(plain)
    resolved = tuple(dict.fromkeys(o for o in native if o not in seen))
    if not resolved:
        raise FlagPolicyError(f"{' '.join(flags)} means nothing on this machine", flag=flags[0], reason="machine")
    return resolved
