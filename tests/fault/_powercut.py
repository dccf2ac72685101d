"""A power cut, modelled: what the disk may hold if the power goes at any instant.

:class:`PowerCut` watches one cache root while a compile runs in this process. It
wraps the calls that change what is durable or visible (``os.fsync``, ``rename``,
``replace``, ``mkdir``, ``rmdir``, ``unlink``, ``link``) and the fault points, and at
each such instant (a *cut*: just before the call, and just after an fsync) records

* what is durable: for each directory, its entries as of its last fsync; for each
  file, its bytes as of its last fsync (everything there when watching began counts
  as durable: a cache long since written back);
* what is there now (the live tree): entries and bytes as this process sees them.

:meth:`PowerCut.images` then gives, for every cut, the trees a disk could hold after
a power cut at that instant — the worst cases POSIX allows, short of hardware that
lies about fsync:

* directory entries: each directory holds its durable entries (an entry created,
  renamed or removed since its directory's last fsync is lost, or comes back), or,
  one directory at a time, or all at once, its live entries (the metadata was written
  back anyway, as a journal commit for another file does);
* file bytes: a file's durable bytes (none, for a file never fsynced), or its live
  bytes, or the first half of them (a partial writeback) — all files alike, or one
  file lagging while the others are live.

Inodes are identified by (dev, ino, generation): an inode number reused after an
unlink is another file. ``v1/tools`` (the sandbox's private state, no part of the
cache's protocol) is left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from safejit import faults

Ident = tuple[int, int, int]
#: A tree as a disk holds it: a name's bytes (a file) or its tree (a directory).
Tree = dict[str, Any]

_WATCHED = ("fsync", "rename", "replace", "mkdir", "rmdir", "unlink", "link")


@dataclass(frozen=True, slots=True)
class Cut:
    label: str
    durable_dirs: dict[Ident, dict[str, Ident]]
    durable_files: dict[Ident, bytes]
    live_dirs: dict[Ident, dict[str, Ident]]
    live_files: dict[Ident, bytes]
    kinds: dict[Ident, bool]  # ident -> is a directory


class PowerCut:
    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)
        self._skip = os.path.join(self.root, "v1", "tools")
        self._lock = threading.RLock()
        self._gen: dict[tuple[int, int], int] = {}
        self._real: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in _WATCHED}
        self._real_point = faults.point
        self.kinds: dict[Ident, bool] = {}
        dirs, files = self._live()
        self.durable_dirs: dict[Ident, dict[str, Ident]] = dirs
        self.durable_files: dict[Ident, bytes] = files
        self.root_ident = self._ident(os.lstat(self.root))
        self.cuts: list[Cut] = []

    # -- watching ----------------------------------------------------------------
    @contextlib.contextmanager
    def watching(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[PowerCut]:
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", self._fsync)
            for name in ("rename", "replace", "link"):
                m.setattr(os, name, self._two_paths(name))
            for name in ("mkdir", "rmdir", "unlink"):
                m.setattr(os, name, self._one_path(name))
            m.setattr(faults, "point", self._point)
            yield self

    def _mine(self, path: Any) -> bool:
        if not isinstance(path, str):
            return False
        full = os.path.abspath(path)
        return (full == self.root or full.startswith(self.root + "/")) and not full.startswith(self._skip)

    def _ident(self, st: os.stat_result) -> Ident:
        return (st.st_dev, st.st_ino, self._gen.get((st.st_dev, st.st_ino), 0))

    def _dies(self, path: str) -> tuple[int, int] | None:
        """The inode that removing (or renaming over) ``path`` would free, if any."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) or st.st_nlink == 1 else None

    def _bury(self, key: tuple[int, int] | None) -> None:
        if key is not None:
            self._gen[key] = self._gen.get(key, 0) + 1

    def _one_path(self, name: str) -> Callable[..., Any]:
        real = self._real[name]

        def op(path: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._mine(path) or "dir_fd" in kwargs:
                return real(path, *args, **kwargs)
            with self._lock:
                self.cut(f"{name} {self._rel(path)}")
                dying = self._dies(path) if name != "mkdir" else None
                result = real(path, *args, **kwargs)
                self._bury(dying)
                return result

        return op

    def _two_paths(self, name: str) -> Callable[..., Any]:
        real = self._real[name]

        def op(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            if not (self._mine(src) or self._mine(dst)) or "src_dir_fd" in kwargs or "dst_dir_fd" in kwargs:
                return real(src, dst, *args, **kwargs)
            with self._lock:
                self.cut(f"{name} {self._rel(src)} -> {self._rel(dst)}")
                dying = self._dies(dst) if name != "link" else None
                if dying is not None and self._dies(src) == dying:
                    dying = None  # (renamed onto itself)
                result = real(src, dst, *args, **kwargs)
                self._bury(dying)
                return result

        return op

    def _fsync(self, fd: int) -> None:
        real = self._real["fsync"]
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if not self._mine(path):
            real(fd)
            return
        with self._lock:
            self.cut(f"fsync {self._rel(path)}")
            real(fd)
            st = os.fstat(fd)
            ident = self._ident(st)
            if stat.S_ISDIR(st.st_mode):
                self.kinds[ident] = True
                self.durable_dirs[ident] = self._entries(path)
            else:
                self.kinds[ident] = False
                with contextlib.suppress(OSError), open(f"/proc/self/fd/{fd}", "rb") as fh:
                    self.durable_files[ident] = fh.read()
            self.cut(f"after fsync {self._rel(path)}")

    def _point(self, name: str) -> None:
        with self._lock:
            self.cut(f"point {name}")
        self._real_point(name)

    def _rel(self, path: str) -> str:
        return os.path.relpath(os.path.abspath(path), self.root)

    # -- the trees ---------------------------------------------------------------
    def _entries(self, path: str) -> dict[str, Ident]:
        out = {}
        with contextlib.suppress(OSError), os.scandir(path) as it:
            for entry in it:
                if not self._mine(entry.path):
                    continue
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                        ident = self._ident(st)
                        self.kinds[ident] = stat.S_ISDIR(st.st_mode)
                        out[entry.name] = ident
        return out

    def _live(self) -> tuple[dict[Ident, dict[str, Ident]], dict[Ident, bytes]]:
        dirs: dict[Ident, dict[str, Ident]] = {}
        files: dict[Ident, bytes] = {}
        todo = [self.root]
        while todo:
            path = todo.pop()
            try:
                ident = self._ident(os.lstat(path))
            except OSError:
                continue
            entries = dirs[ident] = self._entries(path)
            self.kinds[ident] = True
            for name, child in entries.items():
                full = os.path.join(path, name)
                if self.kinds[child]:
                    todo.append(full)
                else:
                    with contextlib.suppress(OSError), open(full, "rb") as fh:
                        files[child] = fh.read()
        return dirs, files

    def cut(self, label: str) -> None:
        with self._lock:
            live_dirs, live_files = self._live()
            self.cuts.append(
                Cut(label, dict(self.durable_dirs), dict(self.durable_files), live_dirs, live_files, dict(self.kinds))
            )

    def images(self) -> Iterator[tuple[str, Tree]]:
        """Every distinct tree a power cut at some cut could leave (see the module doc)."""
        seen: set[str] = set()
        for cut in self.cuts:
            for entries_label, entries_of in _entry_variants(cut):
                for data_label, data_of in _data_variants(cut):
                    tree = _tree(cut, self.root_ident, entries_of, data_of, set())
                    digest = hashlib.sha256(repr(_canonical(tree)).encode()).hexdigest()
                    if digest not in seen:
                        seen.add(digest)
                        yield f"{cut.label} | entries: {entries_label} | bytes: {data_label}", tree


def _entry_variants(cut: Cut) -> Iterator[tuple[str, Callable[[Ident], dict[str, Ident]]]]:
    def durable(ident: Ident) -> dict[str, Ident]:
        return cut.durable_dirs.get(ident, {})

    yield "durable", durable
    yield "live", lambda ident: cut.live_dirs.get(ident, durable(ident))

    def one_live(changed: Ident) -> Callable[[Ident], dict[str, Ident]]:
        return lambda ident: cut.live_dirs[changed] if ident == changed else durable(ident)

    for changed, live in cut.live_dirs.items():
        if live != durable(changed):
            yield f"one dir live {changed}", one_live(changed)


def _data_variants(cut: Cut) -> Iterator[tuple[str, Callable[[Ident], bytes]]]:
    def durable(ident: Ident) -> bytes:
        return cut.durable_files.get(ident, b"")

    def live(ident: Ident) -> bytes:
        return cut.live_files.get(ident, durable(ident))

    def half(ident: Ident) -> bytes:
        data = live(ident)
        return data if data == durable(ident) else data[: len(data) // 2]

    yield "durable", durable
    yield "live", live
    yield "half", half

    def one(lagging: Ident, how: Callable[[Ident], bytes]) -> Callable[[Ident], bytes]:
        return lambda ident: how(ident) if ident == lagging else live(ident)

    for lagging, data in cut.live_files.items():
        if data != durable(lagging):
            yield f"one file durable {lagging}", one(lagging, durable)
            yield f"one file half {lagging}", one(lagging, half)


def _tree(
    cut: Cut,
    ident: Ident,
    entries_of: Callable[[Ident], dict[str, Ident]],
    data_of: Callable[[Ident], bytes],
    above: set[Ident],
) -> Tree:
    out: Tree = {}
    for name, child in entries_of(ident).items():
        if cut.kinds.get(child, False):
            if child not in above:  # (a stale entry can never make a directory its own ancestor)
                out[name] = _tree(cut, child, entries_of, data_of, above | {ident})
        else:
            out[name] = data_of(child)
    return out


def _canonical(tree: Tree) -> list[Any]:
    return sorted((k, _canonical(v) if isinstance(v, dict) else v) for k, v in tree.items())


def materialize(tree: Tree, where: Path) -> Path:
    where.mkdir(parents=True)
    for name, value in tree.items():
        if isinstance(value, dict):
            materialize(value, where / name)
        else:
            (where / name).write_bytes(value)
    return where
