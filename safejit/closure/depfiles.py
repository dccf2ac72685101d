"""Parsers of what tools say they read: Make depfiles (compilers, the assembler) and
linker lists (``--dependency-file``). Pure functions of text; fuzzed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["make_unescaped", "parse_depfile", "parse_listing", "parse_single_rule"]


def parse_depfile(text: str) -> list[str]:
    """Prerequisites of every rule in a Make depfile, in order, deduplicated.

    Handles ``\\``-newline continuations, ``\\ `` escaped spaces, ``\\#`` and
    ``$$``, and rules with no prerequisites (``a.o:``).
    """
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    seen: set[str] = set()
    # Lines end at "\n" only: str.splitlines would also end one at \f, \v, \x1c..., which
    # a name may hold.
    for line in joined.split("\n"):
        if not line or (line[-1] == ":" and " " not in line and "\t" not in line):
            continue  # a rule with nothing after its target (a linker lists one per file)
        for word in _prerequisites(line.removesuffix("\r")):
            if word not in seen:
                seen.add(word)
                out.append(word)
    return out


def parse_single_rule(text: str) -> list[str]:
    """Prerequisites of a depfile that must hold exactly one rule and no control
    character (the assembler's: it lists names from the source's ``.file``
    directives verbatim, so a control character could hide the rest of a line).
    Raises ``ValueError`` otherwise."""
    joined = text.replace("\\\n", " ")
    if _CONTROL.search(joined):
        raise ValueError("a control character in the depfile")
    lines = [line for line in joined.split("\n") if line.strip()]
    if len(lines) != 1 or not _is_rule(lines[0]):
        raise ValueError(f"{len(lines)} rules in a depfile that must hold one")
    return parse_depfile(lines[0])


def parse_listing(text: str) -> list[str]:
    """The names in a linker's list of what it read (``--dependency-file``): the output,
    ``:``, then `` \\``, a newline, two spaces and a name for each file; then a phony
    rule per name. GNU ld writes the names raw (a space, ``#``, ``$`` are part of a
    name), so they are split at those continuations only. Raises ``ValueError`` on a
    control character or when the list starts otherwise."""
    if _CONTROL.search(text):
        raise ValueError("a control character in the list")
    first = text.partition("\n\n")[0].removesuffix("\n")
    target, *names = first.split(" \\\n  ")
    if not target.endswith(":") or "\n" in target or any("\n" in name or not name for name in names):
        raise ValueError("not a linker's list")
    return list(dict.fromkeys(names))


def make_unescaped(name: str) -> str:
    """A name as Make reads it (``\\ `` a space, ``\\#`` a ``#``, ``$$`` a ``$``): how lld
    writes its list, where GNU ld writes names raw."""
    words = _split_words(name)
    return words[0][0] if len(words) == 1 else name


#: Control characters but tab and newline.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _is_rule(line: str) -> bool:
    if "\\" not in line and "$" not in line:
        return any(word.endswith(":") for word in line.replace("\t", " ").split(" "))
    return _has_colon(_split_words(line))


def _prerequisites(line: str) -> list[str]:
    """The words after a rule's target, or none when the line is no rule."""
    if "\\" not in line and "$" not in line:
        # Nothing escaped (what compilers write for ordinary paths): a plain split says the same.
        plain = [w for w in line.replace("\t", " ").split(" ") if w]
        for i, word in enumerate(plain):
            if word.endswith(":"):
                return plain[i + 1 :]
        return []
    words = _split_words(line)
    # The target ends at the first word that ends with an unescaped ':'.
    for i, (_, colon) in enumerate(words):
        if colon:
            return [w for w, _ in words[i + 1 :] if w]
    return []


def _split_words(line: str) -> list[tuple[str, bool]]:
    """Split on unescaped whitespace; flag words that end a target (``x:``)."""
    words: list[tuple[str, bool]] = []
    cur: list[str] = []
    i, n = 0, len(line)

    def flush(colon: bool) -> None:
        if cur or colon:
            words.append(("".join(cur), colon))
            cur.clear()

    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] in " \t#\\":
            cur.append(line[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < n and line[i + 1] == "$":
            cur.append("$")
            i += 2
            continue
        if c in " \t":
            flush(False)
        elif c == ":" and (i + 1 == n or line[i + 1] in " \t") and not _has_colon(words):
            flush(True)
        else:
            cur.append(c)
        i += 1
    flush(False)
    return words


def _has_colon(words: Sequence[tuple[str, bool]]) -> bool:
    return any(colon for _, colon in words)
