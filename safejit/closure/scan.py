"""What a build read, as facts: include names in a file's bytes, the closure's rows and
stat states, the negative lookups (paths that must stay absent), and whether a
closure still holds. Decisions about them (confinement) live in policy.completeness.
(Past the style's ~450 lines: reading a directive as every preprocessor reads it —
splices, comments, digraphs, trigraphs taken or not — is one fact, kept with the
closure whose negatives it decides.)
"""

from __future__ import annotations

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
_QUOTED_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)
#: ``#include NAME`` / ``#include_next NAME``: a header name a macro makes.
_COMPUTED_INCLUDE = re.compile(rb"^[ \t]*#[ \t]*include(?:_next(?!\w)|(?!\w))[ \t]*[A-Za-z_]", re.M)


#: What can hide a directive from the patterns above: a comment or a line splice within
#: it (``#/**/include "x.h"``, ``#inc\\`` and a newline), a comment ending just before
#: it, or the ``%:`` digraph for ``#``.
_HIDDEN = re.compile(
    rb"#[ \t]*(?:/\*|[a-z_]*\\\r?\n|include(?:_next)?[ \t]*(?:/\*|\\\r?\n|[\"<][^\"<>\n]*\\\r?\n))|\*/[ \t]*#"
)
#: A number (its digit separators are no quotes: ``1'000``), a raw string (whatever it
#: holds), a string or character literal (kept), or a comment (a space), as the
#: preprocessor reads them.
_TOKENS = re.compile(
    rb"(?<![\w.])\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*"
    rb'|(?<![\w])(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\(.*?\)\1"'  # (a raw string: R"d( ... )d")
    rb'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*',
    re.S,
)


#: Trigraphs (C++ before 17, C before 23, and any ``-trigraphs``): ``??=`` is a ``#``,
#: ``??/`` a backslash (a line splice before a newline), and so on.
_TRIGRAPH = re.compile(rb"\?\?([=/'()!<>-])")
_TRIGRAPHS: Final = dict(zip(b"=/'()!<>-", (bytes([c]) for c in b"#\\^[]|{}~"), strict=True))


def as_read(data: bytes, *, always: bool = False, trigraphs: bool = False) -> bytes:
    """``data`` as the preprocessor reads its directives — line splices joined, comments
    a space, ``%:`` a ``#``, and with ``trigraphs`` (C++ before 17, strict C) ``??=`` a
    ``#``, ``??/`` a backslash — when something could hide one (``always``: whenever it
    holds a comment or a splice); else ``data`` (the usual case, at no cost)."""
    if trigraphs and b"??" in data:
        data = _TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(1)[0]], data)
        always = True
    splice = b"\\\n" in data or b"\\\r\n" in data
    if not (b"%:" in data or _HIDDEN.search(data) or (always and (b"/*" in data or splice))):
        return data
    joined = data.replace(b"\\\r\n", b"").replace(b"\\\n", b"")
    kept = _TOKENS.sub(lambda m: b" " if m.group(0)[:1] == b"/" else m.group(0), joined)
    return kept.replace(b"%:", b"#")


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
    probes = ((m.group(1).decode(), m.group(2).decode("utf-8", "replace").strip()) for m in found)
    return list(dict.fromkeys(p for p in probes if "\0" not in p[1]))  # (a NUL: no name a compiler looks up)


@dataclass(frozen=True, slots=True)
class ProbeMacros:
    """What a file does with ``__has_include`` through macros, as its directives read:

    * ``wrappers``: the function-like macros it defines that probe their one parameter
      (``#define _CCCL_HAS_INCLUDE(_X) __has_include(_X)``);
    * ``calls``: ``(macro, kind, name)`` for each macro called with a literal header
      name in a condition or a macro body (``#if _CCCL_HAS_INCLUDE(<nvtx3/nvtx3.hpp>)``):
      a probe wherever that macro is a wrapper;
    * ``named``: the macros called with anything else (a name another macro makes):
      what such a call probes, if the macro is a wrapper, is unknown;
    * ``opaque``: the probes whose name a macro makes (``__has_include(HEADER)``).

    Which macro wraps a probe is known only once every file of the closure is read:
    the compiler reads a wrapper's definition in one header and its calls in others."""

    wrappers: frozenset[str]
    calls: tuple[tuple[str, str, str], ...]
    named: frozenset[str]
    opaque: tuple[str, ...]


#: A ``#define`` (the macro, its parameters, its body's first line) or an ``#if`` /
#: ``#elif`` (its condition's first line), found from the ``#`` (fast).
_DIRECTIVE = re.compile(rb"#[ \t]*(?:define[ \t]+([A-Za-z_]\w*)(?>(\([^)\n]*\))?)|(?:el)?if(?!\w))([^\n]*)")
#: ``__has_include(X)`` whose argument is no literal header name.
_NAMED_PROBE = re.compile(rb'__has_include(?:_next)?\s*\(\s*(?![<"\s])([^)\n]*)')
#: A macro called with one literal header name, or with anything else.
_CALL = re.compile(rb'(?<!\w)([A-Za-z_]\w*)\s*\(\s*(?:([<"])([^>"\n]+)[>"]\s*\))?')
_NOT_MACROS: Final = frozenset({b"defined", b"__has_include", b"__has_include_next"})


def probe_macros(data: bytes, read: tuple[bytes, ...] | None = None) -> ProbeMacros | None:
    """The probes ``data`` makes through macros (:class:`ProbeMacros`); None when it
    defines no probing macro, calls no macro in a condition or a macro body, and probes
    no name a macro makes. ``read``: its :func:`readings`, when known. (A call a comment
    shows is taken too: at most one more probe.)"""
    if b"#" not in data and b"%:" not in data and b"??=" not in data:
        return None
    wrappers: set[bytes] = set()
    calls: set[tuple[bytes, bytes, bytes]] = set()
    named: set[bytes] = set()
    opaque: list[bytes] = []
    for text in readings(data) if read is None else read:
        for m in _DIRECTIVE.finditer(text):
            start = m.start()
            line = text.rfind(b"\n", 0, start) + 1
            if line != start and text[line:start].strip(b" \t"):
                continue  # (a "#" within a line: no directive)
            body = _continued(text, m.group(3), m.end())
            if b"(" not in body:
                continue
            if b"__has_include" in body:
                probed = {p.strip() for p in _NAMED_PROBE.findall(body)}
                params = m.group(2)
                if params and probed and probed == {params[1:-1].strip()}:
                    wrappers.add(m.group(1))  # (one parameter, probed as it is)
                    body = _NAMED_PROBE.sub(b"", body)
                opaque += [p.group(0).strip() for p in _NAMED_PROBE.finditer(body)]
            for called, kind, name in _CALL.findall(body):
                if kind:
                    calls.add((called, kind, name.strip()))
                else:
                    named.add(called)
    named -= _NOT_MACROS
    found = {c for c in calls if c[0] not in _NOT_MACROS}
    if not (wrappers or found or named or opaque):
        return None

    def text_of(value: bytes) -> str:
        return sys.intern(value.decode("utf-8", "replace"))

    return ProbeMacros(
        frozenset(map(text_of, wrappers)),
        tuple(sorted((text_of(c), text_of(k), text_of(n)) for c, k, n in found)),
        frozenset(map(text_of, named)),
        tuple(dict.fromkeys(map(text_of, opaque))),
    )


def _continued(text: bytes, first: bytes, end: int) -> bytes:
    """A directive's rest from its first line ``first`` (ending at ``end``), its line
    splices joined: the lines after each that ends in a backslash."""
    if not first.endswith((b"\\", b"\\\r")):
        return first
    parts = [first]
    while parts[-1].endswith((b"\\", b"\\\r")) and end < len(text):
        nxt = text.find(b"\n", end + 1)
        nxt = len(text) if nxt < 0 else nxt
        parts.append(text[end + 1 : nxt])
        end = nxt
    return b"".join(p.rstrip(b"\r").removesuffix(b"\\") for p in parts)


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
