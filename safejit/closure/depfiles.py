"""Parsers of what tools say they read: Make depfiles (compilers, the assembler) and
linker lists (``--dependency-file``). Pure functions of text; fuzzed."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "UNLISTABLE",
    "check_compiler_depfile",
    "make_unescaped",
    "parse_depfile",
    "parse_listing",
    "parse_single_rule",
]


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


def check_compiler_depfile(text: str, exists: Callable[[str], bool]) -> None:
    """Raise ``ValueError`` unless a compiler's depfile ``text`` reads one way only.

    gcc (and clang, and nvcc's host preprocessor) escape a space in a name (``\\ ``), a
    ``#`` (``\\#``) and a ``$`` (``$$``) but write other backslashes raw: a name that
    ends in a backslash, followed by the space between two names, reads as an escaped
    space — one name glued from two, or a name with a trailing space — and the file read
    goes unrecorded. So: no control character; no backslash but a line's continuation
    (`` \\`` and a newline), an escaped ``#``, or an escaped space within a name (a
    character on each side) where no file of the name that would end at that backslash
    exists (``exists``: given that name, as the text spells it up to there); and every
    line a rule. A name holding a backslash is refused with the rest."""
    if _CONTROL.search(text):
        raise ValueError("a control character in a name")
    body = _CONTINUED.sub(" ", text)
    for line in body.split("\n"):
        if line.strip() and not _is_rule(line.removesuffix("\r")):
            raise ValueError("a line that is no rule (a name holding a line break?)")
    if "\\" not in body:
        return  # (what compilers write for ordinary names: nothing escaped, nothing to read two ways)
    word: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        nxt = body[i + 1] if i + 1 < n else ""
        if c == "\\":
            if nxt == "#":
                word.append("#")
            elif nxt in (" ", "\t") and nxt:
                before, after = body[i - 1] if i else "", body[i + 2] if i + 2 < n else ""
                if not before or before in " \t\\\r\n" or not after or after in " \t\\\r\n":
                    raise ValueError("an escaped space at the edge of a name, or a name ending in a backslash")
                if exists("".join(word) + "\\"):
                    raise ValueError("a name ending in a backslash, which reads as an escaped space")
                word.append(nxt)
            else:
                raise ValueError("a backslash in a name")
            i += 2
            continue
        if c == "$" and nxt == "$":
            word.append("$")
            i += 2
            continue
        if c in " \t\r\n":
            word.clear()
        else:
            word.append(c)
        i += 1


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


#: What a path a compiler is given may not hold: a compiler's depfile carries neither a
#: line break nor a backslash one way only (config.py and policy/roots.py refuse them).
UNLISTABLE: Final = re.compile(r"[\x00-\x1f\x7f\\]")
#: Control characters but tab and newline.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
#: A line's continuation as compilers write it: a space, a backslash, the end of the line.
_CONTINUED: Final = re.compile(r" \\\r?\n")


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
