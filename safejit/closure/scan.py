"""What a build read, as facts: include names in a file's bytes, the closure's rows and
stat states, the negative lookups (paths that must stay absent), and whether a
closure still holds. Decisions about them (confinement) live in policy.completeness.
(Past the style's ~450 lines: reading a directive as every preprocessor reads it —
splices, comments, digraphs, trigraphs taken or not, the macros a probe hides in — is
one fact, kept with the closure whose negatives it decides.)
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from .anchors import BAD_REL
from .hashing import Snapshot, digest_bytes, is_racy, read_beneath, snapshot_of

T = TypeVar("T")

__all__ = [
    "COARSE_NS",
    "HAS_INCLUDE",
    "PCH_SUFFIX",
    "PROBE_WORDS",
    "Absence",
    "Closure",
    "Dep",
    "DepState",
    "ProbeMacros",
    "Scanned",
    "as_read",
    "computed_include",
    "dir_snapshot",
    "dirs_unchanged",
    "has_include_names",
    "has_include_probes",
    "merged",
    "negative_dirs",
    "negative_lookups",
    "probe_macros",
    "quoted_includes",
    "scan_file",
    "unchanged",
]


@dataclass(frozen=True, slots=True)
class Dep:
    anchor: str
    relpath: str
    digest: str

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.anchor, self.relpath, self.digest)


def _coarse_ns() -> int:
    """The kernel's file timestamps come from a coarse clock that lags the fine one:
    a file changed just after the compile started can carry a ctime before it. The
    lag is not bounded by one tick: with a tickless kernel the coarse clock moves on
    late after an idle CPU (measured on Linux 6.18, HZ=250: up to 6.4 ms, 1.6 ticks,
    for a third of changes made right after a 4-12 ms sleep). Anything within three
    ticks, and never less than 10 ms, counts as changed during the compile; a build
    so judged is compiled again, never vouched for (tests:
    ``test_reads_outside_roots.py::test_a_directory_swapped_during_the_compile_is_never_vouched_for``)."""
    try:
        tick = int(time.clock_getres(5) * 1e9)  # CLOCK_REALTIME_COARSE
    except OSError:
        tick = 10_000_000
    return max(3 * tick, 10_000_000)


COARSE_NS = _coarse_ns()


@dataclass(frozen=True, slots=True)
class Scanned:
    """A file as a closure scan read it: its stat (taken before reading), digest, link
    count, the ``__has_include`` probes in it (``(kind, name)``, kind ``"`` or ``<``),
    its quoted include names (looked for next to it first), its real path, and whether it
    includes a name a macro makes (``#include NAME``: looked for next to it first too, if
    the macro makes a quoted name); and what it probes through macros (None: nothing, or
    not read: ``macros_read``)."""

    snap: Snapshot
    digest: str
    nlink: int
    probes: list[tuple[str, str]]
    quoted: list[str]
    real: str
    computed: bool = False
    macros: ProbeMacros | None = None
    macros_read: bool = False


#: path -> Scanned. A warm process compiling many kernels re-reads the same system
#: headers: an unchanged, non-racy stat stands for the content (the memory tier's rule,
#: DESIGN.md §6). Process-local.
_SCANS: dict[str, Scanned] = {}
_SCANS_MAX = 16_384


def scan_file(path: str, allowed: Callable[[str], bool], trust_stat: bool, *, macros: bool = True) -> Scanned | None:
    """Read ``path`` — the very file whose real path is ``allowed`` (None: it is not),
    so a path swapped for a symlink between a check and the read cannot make it read
    another — and what it holds (``macros``: its probes through macros too, else
    ``Scanned.macros`` is None). Raises ``OSError`` when it cannot be read."""
    if trust_stat:
        known = _SCANS.get(path)
        if known is not None and (known.macros_read or not macros):
            with contextlib.suppress(OSError):
                snap = snapshot_of(os.stat(path))
                if snap == known.snap and not is_racy(snap) and allowed(known.real):
                    return known
    found = read_beneath(path, allowed)
    if found is None:
        return None
    data, st, real = found
    snap = snapshot_of(st)
    read = readings(data)  # (shared: the reading is most of the work)
    quoted, computed = _includes(data, read)
    probing = probe_macros(data, read) if macros else None
    probes = has_include_probes(data)
    scanned = Scanned(snap, digest_bytes(data), st.st_nlink, probes, quoted, real, computed, probing, macros)
    if trust_stat and not is_racy(snap):
        if len(_SCANS) >= _SCANS_MAX:
            _SCANS.clear()
        _SCANS[path] = scanned
    return scanned


DepState = tuple[str, tuple[int, int, int, int, int], str]


@dataclass(frozen=True, slots=True)
class Closure:
    deps: list[Dep]
    states: list[DepState]
    #: Files whose ctime is after the compile started: the build must not be published.
    too_new: list[str]
    #: Anchored paths that must stay absent (shadowing, false ``__has_include``).
    negatives: list[tuple[str, str]]
    negative_paths: list[str]
    #: Why what was read cannot be recorded so that a leaf stays true (a ``..`` after a
    #: link): the build is returned, never published.
    unsure: tuple[str, ...] = ()


#: ``__has_include("x")`` / ``(<x>)`` with a literal name.
HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?\s*\(\s*([<"])([^>"\n]+)[>"]\s*\)')
_QUOTED_INCLUDE = re.compile(rb'^[ \t\f\v]*#[ \t\f\v]*include[ \t\f\v]*"([^"\n]+)"', re.M)
#: ``#include NAME`` / ``#include_next NAME``: a header name a macro makes.
_COMPUTED_INCLUDE = re.compile(rb"^[ \t\f\v]*#[ \t\f\v]*include(?:_next(?!\w)|(?!\w))[ \t\f\v]*[A-Za-z_]", re.M)


#: What can hide a directive from the patterns above: a comment or a line splice within
#: it (``#/**/include "x.h"``, ``#inc\\`` and a newline, one before a macro's name), a
#: comment ending just before it, a byte order mark, or the ``%:`` digraph for ``#``.
_HIDDEN = re.compile(
    rb"#[ \t\f\v]*(?:/\*|[a-z_]*\\[ \t\f\v]*\r?\n|define[ \t\f\v]*(?:/\*|[\w$]*\\[ \t\f\v]*\r?\n)"
    rb"|include(?:_next)?[ \t\f\v]*(?:/\*|\\[ \t\f\v]*\r?\n"
    rb"|[\"<][^\"<>\n]*\\[ \t\f\v]*\r?\n))|\*/[ \t\f\v]*#|\A\xef\xbb\xbf"
)
#: A line splice: a backslash at a line's end (gcc lets blanks follow it).
_SPLICE = re.compile(rb"\\[ \t\f\v]*\r?\n")
#: A carriage return that ends a line on its own (gcc's reading: a line end).
_LONE_CR = re.compile(rb"\r(?!\n)")
#: A header name after an include or a probe (kept: ``<a/*>`` opens no comment, ``<a'b.h>``
#: no literal), a number (its digit separators are no quotes: ``1'000``), a string or character
#: literal (kept; one not closed runs to its line's end, as gcc lexes it: a ``/*`` in
#: ``#error don't /*`` opens no comment), or a comment (a space), as the preprocessor
#: reads them.
_TOKENS_TEXT: Final = (
    rb"^[ \t\f\v]*#[ \t\f\v]*(?:include|include_next|import)[ \t\f\v]*<[^>\n]*>"
    rb"|__has_include(?:_next)?[ \t\f\v]*\([ \t\f\v]*<[^>\n]*>"
    rb"|(?<![\w.])\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*"
    rb'|"(?:\\.|[^"\\\n])*(?:"|$)|\'(?:\\.|[^\'\\\n])*(?:\'|$)|/\*.*?\*/|//[^\n]*'
)
_TOKENS = re.compile(_TOKENS_TEXT, re.S | re.M)
#: The same, and first the opening of a raw string (``R"d(``: whatever it holds is kept,
#: up to ``)d"``), for :func:`_kept`.
_RAW_OPEN_TEXT: Final = rb'(?<![\w])(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\('
_RAW_OPENS = re.compile(rb"(?=" + _RAW_OPEN_TEXT + rb")")  # (each, overlapping or not)
_RAW_OR_TOKENS = re.compile(_RAW_OPEN_TEXT + b"|" + _TOKENS_TEXT, re.S | re.M)


#: Trigraphs (C++ before 17, C before 23, and any ``-trigraphs``): ``??=`` is a ``#``,
#: ``??/`` a backslash (a line splice before a newline), and so on.
_TRIGRAPH = re.compile(rb"\?\?([=/'()!<>-])")
_TRIGRAPHS: Final = dict(zip(b"=/'()!<>-", (bytes([c]) for c in b"#\\^[]|{}~"), strict=True))


def as_read(data: bytes, *, always: bool = False, trigraphs: bool = False) -> bytes:
    """``data`` as the preprocessor reads its directives — line splices joined, comments
    a space, ``%:`` a ``#``, and with ``trigraphs`` (C++ before 17, strict C) ``??=`` a
    ``#``, ``??/`` a backslash — when something could hide one (``always``: whenever it
    holds a comment or a splice), a carriage return alone a line end; else ``data``
    (the usual case, at no cost)."""
    if trigraphs and b"??" in data:
        data = _TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(1)[0]], data)
        always = True
    lone_cr = b"\r" in data and _LONE_CR.search(data) is not None
    if lone_cr:  # (a line end where no directive pattern looks for one)
        data = _LONE_CR.sub(b"\n", data)
    splice = b"\\\n" in data or b"\\\r\n" in data or (b"\\" in data and _SPLICE.search(data) is not None)
    if not (lone_cr or b"%:" in data or _HIDDEN.search(data) or (always and (b"/*" in data or splice))):
        return data
    joined = _SPLICE.sub(b"", data.removeprefix(b"\xef\xbb\xbf"))  # (and a byte order mark is no text)
    return _kept(joined).replace(b"%:", b"#")


def _kept(text: bytes) -> bytes:
    """``text`` with each comment a space, raw strings and other literals kept whole."""
    if b'R"' not in text:
        return _TOKENS.sub(_token, text)
    parts: list[bytes] = []
    pos = 0
    closes = _raw_closes(text)
    while (m := _RAW_OR_TOKENS.search(text, pos)) is not None:
        delim = m.group(1)
        if delim is None:
            parts += (text[pos : m.start()], _token(m))
            pos = m.end()
            continue
        ends = closes[delim]
        i = bisect.bisect_left(ends, m.end())
        if i == len(ends):  # (no raw string: read on from its next byte, as the pattern would)
            parts.append(text[pos : m.start() + 1])
            pos = m.start() + 1
            continue
        end = ends[i] + len(delim) + 2
        parts.append(text[pos:end])
        pos = end
    parts.append(text[pos:])
    return b"".join(parts)


def _raw_closes(text: bytes) -> dict[bytes, list[int]]:
    """Where each ``)d"`` is in ``text``, for each ``d`` a raw string in it opens with,
    in order: found in one pass per length of ``d`` (looked for from each opening, a
    file of many unclosed ones, each ``d`` another, was read once per opening)."""
    closes: dict[bytes, list[int]] = {m.group(1): [] for m in _RAW_OPENS.finditer(text)}
    for size in sorted({len(d) for d in closes}):
        for m in re.finditer(rb'\)([^()\\ \t\n]{%d})"' % size, text):
            ends = closes.get(m.group(1))
            if ends is not None:
                ends.append(m.start())
    return closes


def _token(m: re.Match[bytes]) -> bytes:
    return b" " if m.group(0)[:1] == b"/" else m.group(0)


def readings(data: bytes, *, always: bool = False) -> tuple[bytes, ...]:
    """``data`` as the preprocessor reads it (:func:`as_read`), with trigraphs and
    without where it holds one: whether the compiler takes them depends on its mode, and
    each reading can hide what the other shows (``??/`` ending a comment line splices
    the next line into the comment, or does not)."""
    plain = as_read(data, always=always)
    if b"??" not in data:
        return (plain,)
    return tuple(dict.fromkeys((plain, as_read(data, always=always, trigraphs=True))))


def _spliced(word: bytes) -> re.Pattern[bytes]:
    """``word`` with any line splices (``\\`` or ``??/`` before a newline) between its letters."""
    splices = rb"(?:(?:\\|\?\?/)\r?\n)*"
    return re.compile(splices.join(re.escape(bytes([c])) for c in word))


_INCLUDE_WORD: Final = _spliced(b"include")
_HAS_INCLUDE_WORD: Final = _spliced(b"__has_include")


def _holds(data: bytes, word: bytes, spliced: re.Pattern[bytes]) -> bool:
    """Whether ``word`` is in ``data``, line splices within it or not (``spliced``)."""
    if word in data:
        return True
    if b"\\" not in data and (b"?" not in data or b"??/" not in data):
        return False  # (no splice: two memchr-fast looks settle most files)
    return spliced.search(data) is not None


def quoted_includes(data: bytes) -> list[str]:
    """Names in ``#include "..."`` lines: searched next to the including file first.
    (A name a macro makes, ``#include NAME``, is not among them.)"""
    return _includes(data)[0]


def computed_include(data: bytes) -> bool:
    """Whether an ``#include`` (or ``#include_next``) in ``data`` names its header by a macro."""
    return _includes(data)[1]


def _includes(data: bytes, read: tuple[bytes, ...] | None = None) -> tuple[list[str], bool]:
    """:func:`quoted_includes` and :func:`computed_include`, ``data`` read once (``read``:
    its :func:`readings`, when known)."""
    if b"%:" not in data and not _holds(data, b"include", _INCLUDE_WORD):
        return [], False
    # Read every way, and what any finds kept: a lookalike the reading as the
    # preprocessor would drop (a raw string, say) costs at most a spurious negative.
    texts = dict.fromkeys((data, *(readings(data) if read is None else read)))
    quoted = [m.group(1).decode("utf-8", "replace") for t in texts for m in _QUOTED_INCLUDE.finditer(t)]
    return list(dict.fromkeys(quoted)), any(_COMPUTED_INCLUDE.search(t) for t in texts)


def has_include_probes(data: bytes) -> list[tuple[str, str]]:
    """``(kind, name)`` of the headers probed with ``__has_include`` (literal arguments
    only), kind ``"`` (looked for next to the file first) or ``<``."""
    if not _holds(data, b"__has_include", _HAS_INCLUDE_WORD):
        return []
    # (as the preprocessor reads it only, with trigraphs and without: a probe in a comment
    # is none, and refusing one that names a path outside the roots refused a sound compile)
    found = [m for text in readings(data, always=True) for m in HAS_INCLUDE.finditer(text)]
    # (the name exactly as written: ``< x.h>`` looks for " x.h")
    probes = ((m.group(1).decode(), m.group(2).decode("utf-8", "replace")) for m in found)
    return list(dict.fromkeys(p for p in probes if "\0" not in p[1]))  # (a NUL: no name a compiler looks up)


@dataclass(frozen=True, slots=True)
class ProbeMacros:
    """What a file does with ``__has_include`` through macros, as its ``#if``, ``#elif``
    and ``#define`` lines read:

    * ``wrappers``: the function-like macros it defines whose every probe is of one of
      their parameters (``#define _CCCL_HAS_INCLUDE(_X) __has_include(_X)``, variadic
      ones too);
    * ``aliases``: ``(macro, name)`` for each object-like macro that is another name
      (``#define HAS_INCLUDE __has_include``): a wrapper if that name is one;
    * ``calls``: ``(macro, kind, name, in_define)`` for each macro (or ``__has_include``)
      called with one literal header name (``#if _CCCL_HAS_INCLUDE(<nvtx3/nvtx3.hpp>)``):
      a probe wherever the macro is a wrapper — of a quoted name, looked for next to
      whichever file expands it when it lies in a macro's body (``in_define``);
    * ``names``: every other identifier there (a wrapper among them is used in a way
      whose probe is unknown: ``APPLY(W, <x.h>)``, ``W(NAME)``, ``W(<x>)`` in a macro
      whose parameter ``x`` is);
    * ``opaque``: the probes whose name a macro makes (``__has_include(HEADER)``), or
      that a computed macro makes (``CAT(HAS, INC)(<x.h>)``);
    * ``defined``: every macro it defines. A ``<...>`` name that passes through a macro
      (given to a wrapper, or in a macro's body) is read as tokens, each identifier in it
      expanded: ``W(<linux/x.h>)`` probes ``<1/x.h>`` in GNU modes.

    Which macro wraps a probe is known only once every file of the closure is read:
    the compiler reads a wrapper's definition in one header and its calls in others."""

    wrappers: frozenset[str]
    aliases: tuple[tuple[str, str], ...]
    calls: tuple[tuple[str, str, str, bool], ...]
    names: frozenset[str]
    opaque: tuple[str, ...]
    defined: frozenset[str] = frozenset()


#: An ``#if``, ``#elif`` or ``#define`` (the macro, its parameters; the rest of the
#: line), found from the ``#`` (fast): :func:`probe_macros` checks it starts a line.
_DIRECTIVE = re.compile(rb"#[ \t\f\v]*(?:(?:el)?if(?!\w)|define[ \t\f\v]+([A-Za-z_$][\w$]*)(?>(\([^)\n]*\))?))([^\n]*)")
_IDENT = re.compile(rb"(?<![\w$])[A-Za-z_$][\w$]*")
_BODY_COMMENT = re.compile(
    rb'"(?:\\.|[^"\\\n])*(?:"|$)|\'(?:\\.|[^\'\\\n])*(?:\'|$)|/\*.*?\*/|//[^\n]*', re.S | re.M
)  # (a quote left open runs to its line's end, as in _TOKENS)
_BLANK: Final = b" \t\f\v"
PROBE_WORDS: Final = frozenset({"__has_include", "__has_include_next"})
_PROBE_BYTES: Final = frozenset(w.encode() for w in PROBE_WORDS)
_DEFINED = re.compile(rb"defined[ \t\f\v]*\(?[ \t\f\v]*\Z")
#: A header name given to what a macro call makes: ``CAT(HAS, INC)(<x.h>)``.
_COMPUTED_CALL = re.compile(rb"\)[ \t\f\v]*\([ \t\f\v]*[<\"]")
#: The longest header name taken as one (a longer one is a probe not known).
_NAME_MAX: Final = 1024
_Params = set[bytes] | frozenset[bytes]


def probe_macros(data: bytes, read: tuple[bytes, ...] | None = None) -> ProbeMacros | None:
    """The probes ``data`` makes through macros (:class:`ProbeMacros`); None when its
    conditions and macro bodies name nothing. ``read``: its :func:`readings`, when
    known. (What a comment spanning lines shows as a directive is taken too: at most
    one more probe, or a build not cached.) Linear in the file's size."""
    if b"#" not in data and b"%:" not in data and b"??=" not in data:
        return None
    found = _Found()
    for text in readings(data) if read is None else read:
        taken = 0  # (where the last directive, its continued lines included, ended)
        for m in _DIRECTIVE.finditer(text):
            start = m.start()
            line = text.rfind(b"\n", 0, start) + 1
            if start < taken or (line != start and text[line:start].strip(_BLANK)):
                continue  # (a "#" within a line, or on a line the last directive continues: no directive)
            body, taken = _continued(text, m.group(3), m.end())
            if b"/" in body:
                body = _BODY_COMMENT.sub(lambda c: b" " if c.group(0)[:1] == b"/" else c.group(0), body)
            if m.group(1) is None:
                found.read(body, in_define=False)
            else:
                found.define(m.group(1), m.group(2), body)
    return found.result()


class _Found:
    """What :func:`probe_macros` gathers, directive by directive."""

    def __init__(self) -> None:
        self.wrappers: set[bytes] = set()
        self.aliases: set[tuple[bytes, bytes]] = set()
        self.calls: set[tuple[bytes, bytes, bytes, bool]] = set()
        self.names: set[bytes] = set()
        self.opaque: list[bytes] = []
        self.defined: set[bytes] = set()

    def define(self, macro: bytes, params: bytes | None, body: bytes) -> None:
        self.defined.add(macro)
        stripped = body.strip(_BLANK)
        if params is None and _IDENT.fullmatch(stripped):
            self.aliases.add((macro, stripped))  # (another name: a wrapper if that one is)
            return
        probed = set()
        if params is not None:
            names = [p.strip(_BLANK) for p in params[1:-1].split(b",")]
            if names and names[-1].endswith(b"..."):
                names[-1] = names[-1][:-3].strip(_BLANK) or b"__VA_ARGS__"
            probed = {n for n in names if n}
        if self.read(body, in_define=True, params=probed) and params is not None:
            self.wrappers.add(macro)

    def read(self, body: bytes, *, in_define: bool, params: _Params = frozenset()) -> bool:
        """Take one condition or macro body; whether it probes one of ``params`` (and
        nothing a macro names otherwise)."""
        wraps = False
        memo: dict[bytes, int] = {}  # (where the next ">", '"', ")" or "(" is: each looked for once)
        for m in _IDENT.finditer(body):
            name = m.group(0)
            at = _skip(body, m.end())
            if at < len(body) and body[at : at + 1] == b"(":
                arg = _skip(body, at + 1)
                opener = body[arg : arg + 1]
                if opener in (b"<", b'"'):
                    probe = self._header_name(body, name, arg, in_define, params, memo)
                    if probe is not None:
                        self.calls.add((name, opener, probe, in_define))
                    elif name in _PROBE_BYTES:
                        self.opaque.append(body[m.start() : min(len(body), m.end() + 80)])
                    else:
                        self.names.add(name)  # (a wrapper, if it is one, whose probe is not known)
                    continue
                if name in _PROBE_BYTES:
                    until = min(_next(body, b")", arg, memo), _next(body, b"(", arg, memo))
                    if body[arg:until].strip(_BLANK) in params:
                        wraps = True
                    else:
                        self.opaque.append(body[m.start() : min(until, m.end() + 80)])
                    continue
            elif name in _PROBE_BYTES and not _DEFINED.search(body, max(0, m.start() - 24), m.start()):
                self.opaque.append(name)  # (passed on by name: where it is called, unknown)
                continue
            self.names.add(name)
        for m in _COMPUTED_CALL.finditer(body):
            self.opaque.append(body[max(0, m.start() - 40) : m.end()])  # (a computed macro, given a header name)
        return wraps

    @staticmethod
    def _header_name(
        body: bytes, name: bytes, arg: int, in_define: bool, params: _Params, memo: dict[bytes, int]
    ) -> bytes | None:
        """The header name ``name(`` is called with, its ``<`` or ``"`` at ``arg``; None
        when it is no one literal name: not closed by ``)``, too long, or, for a ``<...>``
        read as tokens (given to a macro, or in a macro's body), holding blanks (spelt
        as the compiler joins tokens), ``#``, a backslash (a universal character name),
        a byte past ASCII, or one of the macro's parameters."""
        angle = body[arg : arg + 1] == b"<"
        end = _next(body, b">" if angle else b'"', arg + 1, memo)
        if end - arg > _NAME_MAX or (angle and _next(body, b"(", arg + 1, memo) < end):
            return None  # (a call within the name: W(<a W(<b.h>) is none, and reading on was quadratic)
        after = _skip(body, end + 1)
        if end >= len(body) or body[after : after + 1] != b")":
            return None
        probe = body[arg + 1 : end]
        as_tokens = angle and (in_define or name not in _PROBE_BYTES)
        if as_tokens and (
            any(c in probe for c in b" \t\f\v#\\")
            or not probe.isascii()
            or not params.isdisjoint(_IDENT.findall(probe))
        ):
            return None  # (a backslash or a byte past ASCII: an identifier the patterns here do not spell)
        return probe

    def result(self) -> ProbeMacros | None:
        self.names -= {b"defined", *_PROBE_BYTES}
        if not (self.wrappers or self.aliases or self.calls or self.names or self.opaque or self.defined):
            return None

        def text(value: bytes) -> str:
            return sys.intern(value.decode("utf-8", "replace"))

        return ProbeMacros(
            frozenset(map(text, self.wrappers)),
            tuple(sorted((text(a), text(b)) for a, b in self.aliases)),
            tuple(sorted((text(c), text(k), text(n), d) for c, k, n, d in self.calls)),
            frozenset(map(text, self.names)),
            tuple(dict.fromkeys(text(o.strip(_BLANK)) for o in self.opaque)),
            frozenset(map(text, self.defined)),
        )


def _skip(body: bytes, at: int) -> int:
    """``at``, past any blanks."""
    while at < len(body) and body[at] in _BLANK:
        at += 1
    return at


def _next(body: bytes, char: bytes, at: int, memo: dict[bytes, int]) -> int:
    """Where the next ``char`` at or after ``at`` is in ``body`` (its length: none).
    ``at`` only grows from call to call for a ``char``: each is looked for once past
    the last one found, so a line of many calls is read once, not once per call."""
    found = memo.get(char, -1)
    if found < at:
        found = body.find(char, at)
        found = memo[char] = found if found >= 0 else len(body)
    return found


def _continued(text: bytes, first: bytes, end: int) -> tuple[bytes, int]:
    """A directive's rest from its first line ``first`` (ending at ``end``), its line
    splices joined (a backslash ending a line, blanks after it allowed) and a block
    comment still open at a line's end read on to its close; and where that ends."""
    parts = [first]
    in_comment = _open_comment(first)
    while end < len(text):
        last = parts[-1].rstrip(b" \t\f\v\r")
        spliced = not in_comment and last.endswith(b"\\")
        if spliced:
            parts[-1] = last[:-1]
        elif not in_comment:
            break
        nxt = text.find(b"\n", end + 1)
        nxt = len(text) if nxt < 0 else nxt
        line = text[end + 1 : nxt]
        parts.append(line if spliced else b" " + line)
        end = nxt
        if in_comment:
            close = line.find(b"*/")
            in_comment = close < 0 or _open_comment(line[close + 2 :])
        else:
            in_comment = _open_comment(line)
    return b"".join(parts), end


def _open_comment(line: bytes) -> bool:
    """Whether ``line`` ends inside a block comment (strings aside)."""
    return b"/*" in line and b"/*" in _BODY_COMMENT.sub(b"", line)


def has_include_names(data: bytes) -> list[str]:
    """Header names probed with ``__has_include`` (literal arguments only)."""
    return [name for _, name in has_include_probes(data)]


class Absence:
    """``absence(path)``: whether ``path`` does not exist now. Many candidates share a
    parent that does not exist (dir_0/bits/...): one lstat says so for all of them."""

    __slots__ = ("_parents",)

    def __init__(self) -> None:
        self._parents: dict[str, bool] = {}

    def __call__(self, path: str) -> bool:
        parent = path.rpartition("/")[0]
        there = self._parents.get(parent)
        if there is None:
            there = self._parents[parent] = os.path.lexists(parent)
        return not there or not os.path.lexists(path)


def negative_lookups(
    deps: Sequence[str], search_dirs: Sequence[str], probes: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Paths that must stay absent for the build to stay valid; and those of the same
    kind that are there, yet were not read (made during the compile? the caller checks).

    * Shadowing: a dependency found as ``dir_N/rel`` must not appear as
      ``dir_i/rel`` for any earlier search directory ``i < N``.
    * ``__has_include`` names that resolved nowhere must not appear in any
      search directory (nor next to the file that probed them).
    * Precompiled headers: a compiler that looks for ``x.h`` in a directory looks
      for ``x.h.gch`` there first (gcc: a file, or a directory of them) and uses it
      when valid; so every such path beside a header read or looked for is a lookup too.

    Over-approximates where the include name is ambiguous (nested search
    dirs): a spurious entry can only cause a rebuild, never a stale hit.
    """
    cands = _candidates(deps, search_dirs, probes)
    known = _LOOKUPS.get(cands)
    if known is not None and dirs_unchanged(known[2]):
        return list(known[0]), list(known[1])
    # The directories first, the paths looked for after (see negative_dirs).
    vouching = _deepest_dirs(cands)
    absent = Absence()
    out: list[str] = []
    present: list[str] = []
    for path in cands:
        (out if absent(path) else present).append(path)
    out.sort()
    present.sort()
    if vouching:
        _remember(_LOOKUPS, cands, (out, present, list(vouching.items())))
    return list(out), list(present)


def _candidates(deps: Sequence[str], search_dirs: Sequence[str], probes: Iterable[str]) -> tuple[str, ...]:
    """Every path :func:`negative_lookups` looks for, once each, in order."""
    dirs = [d.rstrip("/") for d in search_dirs]
    found: set[str] = set(deps)
    cands: dict[str, None] = {}

    def looked_for(cand: str) -> None:
        for path in (cand, cand + PCH_SUFFIX):
            if path not in found:
                cands[path] = None

    for path in deps:
        if path + PCH_SUFFIX not in found:
            cands[path + PCH_SUFFIX] = None
        for n, d in enumerate(dirs):
            if not path.startswith(d + "/"):
                continue
            rel = path[len(d) + 1 :]
            for earlier in dirs[:n]:
                looked_for(f"{earlier}/{rel}")
    for name in probes:
        if not name or name.startswith("/") or BAD_REL.search(name):
            continue
        named = [f"{d}/{name}" for d in dirs]
        if any(c in found for c in named):
            continue  # resolved: shadowing is covered above
        for c in named:
            looked_for(c)
    return tuple(cands)


#: Process-local: what was found of a set of paths, with the directories recorded just
#: before (their deepest existing ones, none racy). While each is unchanged no entry was
#: added, removed or renamed in it, so what was absent still is and what was there still
#: is: a warm process compiling kernels of the same headers looks each up once.
_LOOKUPS: dict[tuple[str, ...], tuple[list[str], list[str], list[tuple[str, Snapshot]]]] = {}
_VOUCHED: dict[tuple[str, ...], list[tuple[str, Snapshot]]] = {}
_MEMO_MAX: Final = 1024


def _remember(memo: dict[tuple[str, ...], T], key: tuple[str, ...], value: T) -> None:
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    memo[key] = value


#: What gcc looks for beside a header before the header itself (a precompiled one).
PCH_SUFFIX: Final = ".gch"


def merged(first: Closure, second: Closure) -> Closure:
    """One closure of both (``second``: what other tools read, which adds no negatives)."""
    if not second.deps and not second.too_new and not second.unsure:
        return first
    return Closure(
        [*first.deps, *second.deps],
        [*first.states, *second.states],
        [*first.too_new, *second.too_new],
        first.negatives,
        first.negative_paths,
        (*first.unsure, *second.unsure),
    )


def dir_snapshot(path: str) -> Snapshot:
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(path)
    return (st.st_dev, st.st_ino, 0, st.st_mtime_ns, st.st_ctime_ns)


def negative_dirs(paths: Sequence[str]) -> list[tuple[str, Snapshot]] | None:
    """The deepest existing directory above each path, with its identity and last
    change — if every path is absent (else None). The directories are recorded first
    and the paths found absent after: an entry added since either was seen here or
    changed a recorded directory, however long the two steps took. Empty when a
    directory changed within the racy window (what it holds may still change within
    the same timestamp tick, so its stat cannot vouch for it), or none exists above."""
    key = tuple(paths)
    known = _VOUCHED.get(key)
    if known is not None and dirs_unchanged(known):
        return list(known)
    found = _deepest_dirs(paths)
    absent = Absence()
    if not all(absent(p) for p in paths):
        return None
    if not found:
        return []
    vouching = list(found.items())
    _remember(_VOUCHED, key, vouching)
    return list(vouching)


def _deepest_dirs(paths: Sequence[str]) -> dict[str, Snapshot] | None:
    """The deepest existing directory above each path, with its stat (None: a racy one,
    or none at all). Each parent is resolved once, however many paths it holds."""
    found: dict[str, Snapshot] = {}
    deepest: dict[str, str] = {}  # a parent -> the deepest existing directory at or above it
    for path in paths:
        parent = path[: path.rfind("/")] or "/"  # (os.path.dirname, less a call: paths are absolute)
        if parent in deepest:
            continue
        walked = []
        while True:
            if parent in deepest:
                top = deepest[parent]
                break
            walked.append(parent)
            try:
                snap = dir_snapshot(parent)
            except OSError:
                # Walk up only past what is not there at all: a name that is there but
                # leads nowhere (a dangling symlink, a loop, no access) can come to lead
                # somewhere with no change to the directory above it.
                if not _absent(parent):
                    return None
                up = os.path.dirname(parent)
                if up == parent:
                    return None
                parent = up
                continue
            if is_racy(snap):
                return None
            found[parent] = snap
            top = parent
            break
        for d in walked:
            deepest[d] = top
    return found


def _absent(path: str) -> bool:
    """Whether there is no entry at all at ``path`` (not even a dangling symlink)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def dirs_unchanged(dirs: Iterable[tuple[str, Snapshot]]) -> bool:
    """Whether each directory :func:`negative_dirs` recorded still has that stat (no
    entry added, removed or renamed in it since)."""
    try:
        return all(dir_snapshot(d) == snap for d, snap in dirs)
    except OSError:
        return False


def unchanged(closure: Closure, dirs: Sequence[tuple[str, Snapshot]] = ()) -> bool:
    """Whether every file of ``closure`` still has the stat it was hashed with and every
    negative is still absent: ``dirs`` (:func:`negative_dirs` of its negatives, when it
    vouched) unchanged, else each path looked for. A scan made while the compiler ran
    (cf. ``listed`` in the build job) holds only if so when it has ended: nvcc, for one,
    reads the headers again after writing its depfile. A file that passed the scan has
    a ctime from before the compile; any write since gives it a later one."""
    try:
        for path, snap, _ in closure.states:
            if snapshot_of(os.stat(path)) != snap:
                return False
    except OSError:
        return False
    if dirs:
        return dirs_unchanged(dirs)
    absent = Absence()
    return all(absent(path) for path in closure.negative_paths)
