"""Toolchain probes: running a compiler to learn its version and search dirs,
remembered per user (private directory) and keyed by the binary's stat, so a
fresh process that only hits the cache starts no compiler."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from .. import _clock, _forksafe
from ..closure.hashing import Snapshot, digest_bytes, hash_file, is_racy
from ..errors import ConfigError
from ..sandbox import SYSTEM_PATH
from ..sandbox.statedir import open_private_file
from ..spec import LoadBaseline, Toolchain
from .base import Runner

__all__ = [
    "RECHECK_S",
    "ProbeCache",
    "ProbeMemo",
    "Tool",
    "absent_search_dirs",
    "compiler_search_dirs",
    "dir_ident",
    "dir_idents",
    "file_ident",
    "find_program",
    "hash_tools",
    "install_dir",
    "program_dirs",
    "run_text",
    "spelled_search_dirs",
]


#: ``(name, resolved path, stat)`` of a program or file a probe found and hashed: the
#: stat taken before the bytes were read (``hash_file``), so a file changed since it was
#: hashed is a changed file on the next look.
Tool = tuple[str, str, Snapshot]


def hash_tools(found: Iterable[tuple[str, str]]) -> tuple[list[str], list[Tool]]:
    """The digests of the files ``(name, resolved path)``, and the tools to record."""
    digests, tools = [], []
    for name, real in found:
        digest, snap = hash_file(real)
        digests.append(digest)
        tools.append((name, real, snap))
    return digests, tools


def file_ident(path: str) -> list[Any]:
    """A binary's identity for probe caching: path and full stat."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path} cannot be used: {exc}") from exc
    return [path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def dir_ident(path: str) -> list[int]:
    """A directory's identity and last change (a program added to it changes it); []
    when there is none (one made later changes that)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def dir_idents(paths: Iterable[str]) -> list[list[Any]]:
    """``[path, *dir_ident(path)]`` of each: taken before a probe looks for programs in
    them, so a program added while it looks changes them."""
    return [[d, *dir_ident(d)] for d in paths]


def program_dirs(search_dirs_output: str, kind: str = "programs") -> list[str]:
    """The directories a driver looks in for the programs it runs (``-print-search-dirs``;
    ``kind="libraries"``: for the libraries it links)."""
    head = f"{kind}: ="
    for line in search_dirs_output.splitlines():
        if line.startswith(head):
            return list(dict.fromkeys(os.path.normpath(d) for d in line[len(head) :].split(":") if d))
    return []


def install_dir(search_dirs_output: str) -> list[str]:
    """The driver's own install dir (``install:`` of ``-print-search-dirs``: its headers,
    specs and libraries), in a list of one, or none."""
    for line in search_dirs_output.splitlines():
        if line.startswith("install: ") and len(line) > len("install: "):
            return [os.path.normpath(line[len("install: ") :])]
    return []


def find_program(name: str) -> str | None:
    """The file a driver runs for ``name`` as it reported it (``-print-prog-name``):
    itself when absolute, else found on the fixed PATH; resolved. None if none."""
    found = name if os.path.isabs(name) else shutil.which(name, path=SYSTEM_PATH)
    return os.path.realpath(found) if found and os.path.isfile(found) else None


def _reached(name: str) -> list[int] | None:
    """``file_ident`` without the path of the file ``name`` reaches now (as
    :func:`find_program` finds it), None if none."""
    places = [name] if os.path.isabs(name) else [os.path.join(d, name) for d in SYSTEM_PATH.split(":") if d]
    for place in places:
        try:
            st = os.stat(place)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (place is name or os.access(place, os.X_OK)):
            return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return None


def run_text(run: Runner, argv: Sequence[str], extra_read: Sequence[str] = ()) -> str:
    result = run(argv, cwd="", timeout=60, extra_read=extra_read)
    if result.returncode != 0:
        raise ConfigError(f"probing {argv[0]} failed ({result.returncode}): {result.log[-2000:]}")
    return result.log


def absent_search_dirs(verbose: str) -> list[list[Any]]:
    """The include dirs a compiler would search but skipped, not there (``ignoring
    nonexistent directory`` in ``cc -E -v``), as :func:`dir_idents` rows of a dir not
    there: a probe stands only while each is still absent. Such a dir made later (a
    package that installs ``/usr/local/include/<multiarch>``) is searched by every
    compile after, ahead of those the probe listed; a row is never taken of how it is
    now (one made since the compiler looked must not vouch for the probe)."""
    return [[os.path.normpath(d)] for d in _skipped(verbose)]


def _skipped(verbose: str) -> list[str]:
    head = 'ignoring nonexistent directory "'
    return [line[len(head) : -1] for line in verbose.splitlines() if line.startswith(head) and line.endswith('"')]


def spelled_search_dirs(verbose: str) -> list[str]:
    """The include dirs ``cc -E -v`` names, searched or skipped as not there, as it
    spells them (``/usr/lib/gcc/<triple>/12/../../../../include/c++/12``: as it looks
    them up at every compile; ``Toolchain.spelled_dirs``)."""
    return [*_skipped(verbose), *_search_list(verbose)]


def compiler_search_dirs(verbose: str) -> list[str]:
    """The include search list printed by ``cc -E -v``."""
    return [os.path.normpath(d) for d in _search_list(verbose)]


def _search_list(verbose: str) -> list[str]:
    dirs: list[str] = []
    inside = False
    for line in verbose.splitlines():
        if line.startswith(("#include <...> search starts here:", '#include "..." search')):
            inside = True
            continue
        if line.startswith("End of search list."):
            break
        if inside and line.startswith(" "):
            dirs.append(line.strip().removesuffix(" (framework directory)"))
    return dirs


_IDENT = msgspec.msgpack.Encoder()


class ProbeCache:
    """Probed toolchains, one JSON file each, keyed by the driver's identity. The other
    programs a probe found (cc1, as, ld) are recorded by the name the driver gave and
    the file it resolved to, with its stat, and so are the directories the driver
    looks in for them: a probe is reused only while each name still resolves to that
    same, unchanged file and no such directory has changed (binutils upgraded on its
    own, a symlink switched, a program newly placed ahead: none changes the driver)."""

    def __init__(self, state_dir: str | None) -> None:
        self._dir = state_dir
        #: What this process found or probed, per identity: the toolchain, the programs and
        #: dirs that vouch for it (as the file holds them), and since when (``_clock.now()``), for
        #: :meth:`unchanged`.
        self._witness: dict[str, tuple[Toolchain, list[Any], list[Any], float]] = {}

    def _witnessed(self, ident: list[Any], tc: Toolchain, tools: list[Any], dirs: list[Any]) -> None:
        key = digest_bytes(_IDENT.encode(ident))
        old = self._witness.get(key)
        if old is None or old[:3] != (tc, tools, dirs):  # (the same again keeps its first time)
            self._witness[key] = (tc, tools, dirs, _clock.now())

    def unchanged(self, ident: list[Any], tc: Toolchain, since: float) -> bool:
        """Whether ``tc``, found or probed in this process under ``ident`` no later than
        ``since`` (a build's start), still stands: the driver is that same file
        (``ident``: its stat now), each program it runs and each dir it finds them in
        unchanged — a stat each, no file read. A driver first seen after ``since`` (one
        replaced and then put back while the build ran) vouches for nothing."""
        witness = self._witness.get(digest_bytes(_IDENT.encode(ident)))
        if witness is None or witness[0] != tc or witness[3] > since:
            return False
        tools, dirs = witness[1], witness[2]
        return all(_reached(name) == ident_of[1:] for name, *ident_of in tools) and all(
            dir_ident(path) == ident_of for path, *ident_of in dirs
        )

    def _path(self, ident: list[Any]) -> str | None:
        # (``ident``: text and ints, MessagePack-encoded: typed and length-prefixed)
        return os.path.join(self._dir, f"probe-{digest_bytes(_IDENT.encode(ident))[:32]}.json") if self._dir else None

    def get(self, ident: list[Any]) -> Toolchain | None:
        path = self._path(ident)
        if path is None:
            return None
        try:
            with open(open_private_file(path), "rb") as fh:  # (ours, regular, no link)
                data = msgspec.json.decode(fh.read())
            if not isinstance(data, dict) or data.get("ident") != ident:
                return None
            for name, *ident_of in data["tools"]:
                # The file the name reaches now (through symlinks, "..", the fixed PATH),
                # by its stat: the same file, unchanged. No realpath: a probe lists a
                # dozen files (what every link reads), checked in each new process.
                if _reached(name) != ident_of[1:]:
                    return None
            for path, *ident_of in data["dirs"]:
                if dir_ident(path) != ident_of:
                    return None
            found = Toolchain(
                compiler=data["compiler"],
                version=data["version"],
                digest=data["digest"],
                roots=tuple(data["roots"]),
                search_dirs=tuple(data["search_dirs"]),
                asm_deps=data["asm_deps"] is True,
                link_deps=data["link_deps"] is True,
                link_inputs=tuple(str(p) for p in data["link_inputs"]),
                link_roots=tuple(str(p) for p in data["link_roots"]),
                prefix=str(data.get("prefix", "")),
                spelled_dirs=tuple(str(p) for p in data["spelled_dirs"]),
                load_baseline=_baseline_from(data.get("load_baseline")),
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError, ConfigError):
            return None
        self._witnessed(ident, found, data["tools"], data["dirs"])
        return found

    def put(self, ident: list[Any], tc: Toolchain, tools: Sequence[Tool] = (), dirs: Sequence[list[Any]] = ()) -> None:
        """Remember ``tc``; ``tools``: the programs it runs and files it reads, as hashed
        (:func:`hash_tools`); ``dirs``: where the driver looks for them, as they were
        before the probe looked (:func:`dir_idents`). Not when one of the tools changed
        within the last moments: its stat cannot vouch for it yet."""
        path = self._path(ident)
        tool_rows = [[name, real, *snap] for name, real, snap in tools]
        self._witnessed(ident, tc, tool_rows, [list(d) for d in dirs])
        # (a dir ident is [path, dev, ino, mtime, ctime]; [path] when there is none)
        dir_snaps = [(d[1], d[2], 0, d[3], d[4]) for d in dirs if len(d) == 5]
        if path is None or any(is_racy(snap) for snap in [*(s for _, _, s in tools), *dir_snaps]):
            return
        data = {
            "ident": ident,
            "compiler": tc.compiler,
            "version": tc.version,
            "digest": tc.digest,
            "roots": list(tc.roots),
            "search_dirs": list(tc.search_dirs),
            "asm_deps": tc.asm_deps,
            "link_deps": tc.link_deps,
            "link_inputs": list(tc.link_inputs),
            "link_roots": list(tc.link_roots),
            "prefix": tc.prefix,
            "spelled_dirs": list(tc.spelled_dirs),
            "load_baseline": None if tc.load_baseline is None else dataclasses.asdict(tc.load_baseline),
            "tools": tool_rows,
            "dirs": [list(d) for d in dirs],
        }
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
        try:
            Path(tmp).write_text(json.dumps(data))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


#: How long a process builds with a toolchain it found before it looks again: a probe
#: (its cache's hit: the compiler, the programs it runs and the dirs it finds them in,
#: a stat each), redone in full when one changed. A compiler upgraded under a running
#: process is used, and keys its builds, within this.
RECHECK_S: Final = 1.0


class ProbeMemo:
    """This process's toolchains (per ``key``: a language, a compiler), each found again
    by its ``probe`` once it is :data:`RECHECK_S` old."""

    def __init__(self) -> None:
        self._lock = _forksafe.Lock()
        self._found: dict[Hashable, tuple[Toolchain, float]] = {}

    def get(self, key: Hashable, probe: Callable[[], Toolchain]) -> Toolchain:
        found = self._found.get(key)
        if found is not None and _clock.now() - found[1] < RECHECK_S:
            return found[0]
        with self._lock:
            found = self._found.get(key)
            if found is None or _clock.now() - found[1] >= RECHECK_S:
                checked = _clock.now()  # (as of the probe's start: what it saw is at least this recent)
                found = self._found[key] = (probe(), checked)
            return found[0]

    def __getitem__(self, key: Hashable) -> Toolchain:
        return self._found[key][0]

    def forget(self, key: Hashable) -> None:
        """Probe ``key`` again next time (its toolchain was found changed)."""
        with self._lock:
            self._found.pop(key, None)


def _baseline_from(value: object) -> LoadBaseline | None:
    """A :class:`LoadBaseline` as :meth:`ProbeCache.put` wrote it; ``ValueError`` for
    anything else (the probe is then done again)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {f.name for f in dataclasses.fields(LoadBaseline)}:
        raise ValueError("not a load baseline")
    refs = value.pop("startup_refs")
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise ValueError("not a load baseline")
    if not all(type(v) is int for v in value.values()):
        raise ValueError("not a load baseline")
    return LoadBaseline(**value, startup_refs=tuple(refs))
