"""Whole-cache operations: listing, integrity verification, ``check()``, prune, gc,
and reading the usage records back.

A cache root is hostile ground (others write it). These walk ``<root>/v1`` without
following a symlink, and report what they cannot read, or what stands where a
directory should be, as findings instead of failing. Whatever they change — a
leaf pruned, an entry quarantined, a residue removed — they reach through
directory file descriptors opened one component at a time with ``O_NOFOLLOW``
(``rename``/``unlink``/``rmtree`` relative to them): a directory swapped for a
symlink meanwhile makes the operation fail, never act outside ``<root>/v1``.
Nothing at all is changed when ``v1`` itself is not a real directory.

(Over the style's 400 lines: the walks, the verifier and the two removers share
the descriptor helpers at the end, which must not leak into a public module.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from ..outcomes import Miss
from .disk import DiskTier
from .layout import (
    MANIFEST,
    MARKER,
    O_DIR,
    OBSOLETE,
    RESERVED,
    CacheLayout,
    LeafPath,
    build_key_of,
    deps_key_of,
    entries,
    is_real_dir,
)
from .leaf import MANIFEST_LIMIT, Manifest, Rejection, VerifiedLeaf, decode_manifest
from .usage import RECORD_LIMIT, UsageError, UsageRecord, decode_usage

__all__ = [
    "LeafInfo",
    "PruneReport",
    "UsageEntry",
    "check",
    "count_entries",
    "damaged",
    "gc",
    "iter_leaves",
    "leaf_id",
    "prune",
    "read_manifest",
    "read_usage",
    "remove_usage",
    "verify_all",
]

#: Open a directory, never through a symlink.
#: Open a file to read, never through a symlink, never blocking on a FIFO or taking a tty.
_O_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: Hex digits of the build key, then of the deps key, in a leaf's short id.
ID_BUILD, ID_DEPS = 8, 4


def leaf_id(build_key: str, deps_key: str) -> str:
    """A leaf's short id (``safejit ls``/``inspect``): the first 8 hex digits of its
    build key and 4 of its deps key — leaves of one build share the first 8."""
    return build_key[:ID_BUILD] + deps_key[:ID_DEPS]


@dataclass(frozen=True, slots=True)
class LeafInfo:
    root: str
    tenant: str
    backend: str
    build_key: str
    deps_key: str
    path: str
    size: int
    mtime: float

    @property
    def id(self) -> str:
        return leaf_id(self.build_key, self.deps_key)


def _layout(root: str) -> CacheLayout:
    """The layout of ``root`` as it really is (a root given through a symlink is fine;
    a ``v1`` that is a symlink is not walked: see :func:`damaged`)."""
    return CacheLayout(os.path.realpath(os.path.expanduser(root)))


def _sound_base(layout: CacheLayout) -> bool:
    return is_real_dir(layout.base)


def iter_leaves(root: str) -> Iterator[LeafInfo]:
    layout = _layout(root)
    if not _sound_base(layout):
        return
    for found in layout.leaves():
        info = _info(layout.root, found)
        if info is not None:
            yield info


def _info(root: str, found: LeafPath) -> LeafInfo | None:
    size = 0
    try:
        with os.scandir(found.path) as it:
            for f in it:
                if f.is_file(follow_symlinks=False):
                    size += f.stat(follow_symlinks=False).st_size
        mtime = os.lstat(found.path).st_mtime
    except OSError:
        return None
    return LeafInfo(root, found.tenant, found.backend, found.build_key, found.deps_key, found.path, size, mtime)


def read_manifest(info: LeafInfo) -> Manifest:
    """A leaf's manifest, decoded by the strict schema (``ManifestError``, or
    ``OSError`` when it cannot be read); not verified against the leaf's files."""
    parents = (info.tenant, info.backend, info.build_key[:2], f"build-{info.build_key}", f"deps-{info.deps_key}")
    with _layout(info.root).open_dir(*parents) as leaf:
        return decode_manifest(_read_at(leaf, MANIFEST, MANIFEST_LIMIT))


def damaged(root: str) -> list[tuple[str, str]]:
    """``(path, why)`` of what stands where the layout wants a directory and is not one
    (``v1``, one of its own directories, a tenant, backend, shard, build dir or leaf
    replaced by a file, a symlink or a FIFO), and of entries that belong nowhere in the
    leaf tree."""
    layout = _layout(root)
    if os.path.lexists(layout.base) and not _sound_base(layout):
        return [(layout.base, "the cache's v1 directory is not a directory (a symlink?)")]
    out: list[tuple[str, str]] = []
    for entry in _entries(layout.base):
        if entry.is_dir(follow_symlinks=False):
            continue
        what = f"the cache's {entry.name} directory" if entry.name in RESERVED else "a tenant directory"
        out.append((entry.path, f"{what} that is not a directory ({_kind(entry)})"))
    for tenant in _dirs(layout.base, skip=RESERVED):
        for backend in _entries(tenant.path):
            if not backend.is_dir(follow_symlinks=False):
                out.append((backend.path, f"a backend directory that is not a directory ({_kind(backend)})"))
                continue
            for shard in _entries(backend.path):
                if not shard.is_dir(follow_symlinks=False):
                    out.append((shard.path, f"a shard directory that is not a directory ({_kind(shard)})"))
    for _, _, build in layout.build_dirs():
        if build_key_of(build.name) is None:
            out.append((build.path, "not a build directory"))
            continue
        if not build.is_dir(follow_symlinks=False):
            out.append((build.path, f"a build directory that is not a directory ({_kind(build)})"))
            continue
        for entry in _entries(build.path):
            if deps_key_of(entry.name) is None:
                out.append((entry.path, "stray entry in a build directory"))
            elif not entry.is_dir(follow_symlinks=False):
                out.append((entry.path, f"a leaf that is not a directory ({_kind(entry)})"))
    return out


def verify_all(root: str, *, fix: bool = False) -> Iterator[tuple[LeafInfo, Rejection | None]]:
    """Integrity of every leaf (marker, manifest, name, artifact bytes); with ``fix``,
    damaged leaves — and whatever stands where a leaf or build dir should be — are
    moved to quarantine (the entry itself, never followed)."""
    layout = _layout(root)
    for path, why in damaged(root):
        if fix and path != layout.base:
            layout.set_aside(path)
        info = LeafInfo(layout.root, "", "", "", "", path, 0, 0.0)
        yield info, Rejection(Miss.DAMAGED, why, path, layout.root)
    for info in iter_leaves(root):
        disk = DiskTier((layout.root,), tenant=info.tenant, backend=info.backend)
        result = disk.verify(info.path, layout.root, info.build_key, None)
        bad = None if isinstance(result, VerifiedLeaf) else result
        if bad is not None and fix and bad.reason.corrupt:
            layout.set_aside(info.path)
        yield info, bad


def check(root: str) -> list[str]:
    """Every consistency problem under ``root``; empty when the cache is sound.

    A sound cache shows no leaf that fails its integrity check, no leaf with
    files other than its own, and no stray or damaged entry in the build tree.
    """
    problems: list[str] = []
    for info, bad in verify_all(root):
        if bad is not None:
            problems.append(f"{info.path}: {bad.reason}: {bad.detail}")
            continue
        names = set(os.listdir(info.path))
        extra = names - {MANIFEST, MARKER} - {n for n in names if n.startswith("artifact.")}
        if extra or len(names) != 3:
            problems.append(f"{info.path}: unexpected files {sorted(names)}")
    return problems


def count_entries(root: str, name: str) -> int | None:
    """How many entries ``<root>/v1/<name>`` holds (``tmp``, ``quarantine``...): 0 when
    it is absent, None when it is not a real directory."""
    try:
        with _layout(root).open_dir(name) as fd:
            return len(os.listdir(fd))
    except FileNotFoundError:
        return 0
    except OSError:
        return None


# -- usage records --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UsageEntry:
    """A usage record as found: decoded, or the ``problem`` that kept it from being."""

    tenant: str
    path: str
    record: UsageRecord | None
    problem: str = ""


def read_usage(root: str) -> Iterator[UsageEntry]:
    """Every usage record under ``root`` (``<root>/v1/usage/<tenant>/*.json``), each
    decoded by the strict schema or reported with its problem (a symlink, a FIFO, a
    file too large, JSON that does not match); a writer's temporary (``.``) is skipped."""
    layout = _layout(root)
    try:
        usage = layout.open_dirs(("usage",))
    except OSError:
        return  # absent; or not a directory: damaged() reports it
    try:
        for tenant in entries(usage):
            where = os.path.join(layout.usage, tenant.name)
            if not tenant.is_dir(follow_symlinks=False):
                yield UsageEntry(tenant.name, where, None, f"not a directory ({_kind(tenant)})")
                continue
            try:
                fd = os.open(tenant.name, O_DIR, dir_fd=usage)
            except OSError as exc:
                yield UsageEntry(tenant.name, where, None, f"cannot be read: {exc.strerror}")
                continue
            try:
                yield from _records_at(fd, tenant.name, where)
            finally:
                os.close(fd)
    finally:
        os.close(usage)


def _records_at(fd: int, tenant: str, where: str) -> Iterator[UsageEntry]:
    for entry in entries(fd):
        if entry.name.startswith("."):
            continue
        path = os.path.join(where, entry.name)
        try:
            record = decode_usage(_read_at(fd, entry.name, RECORD_LIMIT))
        except OSError as exc:
            yield UsageEntry(tenant, path, None, f"cannot be read: {exc.strerror or exc}")
            continue
        except UsageError as exc:
            yield UsageEntry(tenant, path, None, f"not a usage record: {exc}")
            continue
        yield UsageEntry(tenant, path, record)


def remove_usage(root: str, entry: UsageEntry) -> bool:
    """Delete a usage record :func:`read_usage` found bad — or whatever stands in a
    record's or a tenant directory's place — relative to descriptors, never followed."""
    layout = _layout(root)
    try:
        if os.path.dirname(entry.path) == layout.usage:  # the tenant's entry itself
            with layout.open_dir("usage") as fd:
                os.unlink(entry.tenant, dir_fd=fd)  # (a directory it could not open stays: EISDIR)
        else:
            with layout.open_dir("usage", entry.tenant) as fd:
                _remove_at(fd, os.path.basename(entry.path))
    except OSError:
        return False
    return True


# -- prune ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PruneReport:
    examined: int
    removed: int
    freed: int
    kept_recent: int


def _discard_leaf(layout: CacheLayout, info: LeafInfo) -> bool:
    """Make a leaf vanish atomically (rename into tmp/), then delete it there; the
    build dir too, once empty."""
    shard = (info.tenant, info.backend, info.build_key[:2])
    build = f"build-{info.build_key}"
    trash = f"trash-{uuid.uuid4().hex}"
    try:
        with layout.open_dir(*shard) as shard_fd, layout.open_dir("tmp", make=True) as tmp:
            build_fd = os.open(build, O_DIR, dir_fd=shard_fd)
            try:
                os.rename(f"deps-{info.deps_key}", trash, src_dir_fd=build_fd, dst_dir_fd=tmp)
            finally:
                os.close(build_fd)
            with contextlib.suppress(OSError):
                os.rmdir(build, dir_fd=shard_fd)  # the build dir, once empty
            with contextlib.suppress(OSError):  # (what is left is staging residue: gc's)
                _remove_at(tmp, trash)
    except OSError:
        return False  # already gone, or not ours to move
    return True


def prune(
    root: str,
    *,
    max_bytes: int | None = None,
    max_age_s: float | None = None,
    keep_per_build: int | None = None,
    grace_s: float = 60.0,
    now: float | None = None,
    progress: Callable[[int], None] | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete leaves: older than ``max_age_s``, beyond the ``keep_per_build`` newest
    of their build, then least recently used until under ``max_bytes``.

    A leaf touched within ``grace_s`` is never deleted (a running process may have
    just found it). Leaves vanish by one rename, so readers see a whole leaf or none.
    ``dry_run``: report what would go, delete nothing.
    """
    if keep_per_build is not None and keep_per_build < 1:
        raise ValueError("keep_per_build must be at least 1")
    layout = _layout(root)
    clock = time.time() if now is None else now
    infos = list(iter_leaves(root))
    doomed: dict[str, LeafInfo] = {}
    if max_age_s is not None:
        doomed.update((i.path, i) for i in infos if clock - i.mtime > max_age_s)
    if keep_per_build is not None:
        builds: dict[str, list[LeafInfo]] = {}
        for info in infos:
            builds.setdefault(os.path.dirname(info.path), []).append(info)
        for group in builds.values():
            group.sort(key=lambda i: i.mtime, reverse=True)
            doomed.update((i.path, i) for i in group[keep_per_build:])
    spared = 0
    if max_bytes is not None:
        total = sum(i.size for i in infos if i.path not in doomed)
        for info in sorted(infos, key=lambda i: i.mtime):
            if total <= max_bytes:
                break
            if info.path in doomed:
                continue
            if clock - info.mtime > grace_s:
                doomed[info.path] = info
                total -= info.size
            else:
                spared += 1
    spared += sum(1 for i in doomed.values() if clock - i.mtime <= grace_s)
    removed = freed = 0
    for n, info in enumerate(sorted(doomed.values(), key=lambda i: i.mtime)):
        if clock - info.mtime > grace_s and (dry_run or _discard_leaf(layout, info)):
            removed += 1
            freed += info.size
        if progress is not None:
            progress(n + 1)
    return PruneReport(len(infos), removed, freed, spared)


# -- gc -------------------------------------------------------------------------
def gc(root: str, *, max_age_s: float = 24 * 3600.0, now: float | None = None) -> dict[str, int]:
    """Remove staging residue, quarantined leaves, usage records and idle lock files
    older than ``max_age_s``, and the obsolete directories of ``v1`` (``OBSOLETE``,
    whatever their age), and move aside whatever stands where a leaf or a build dir
    should be. Never follows symlinks; never leaves ``<root>/v1`` (nothing at all when
    ``v1`` is not a real directory)."""
    layout = _layout(root)
    clock = time.time() if now is None else now
    counts = {"staging": 0, "quarantine": 0, "usage": 0, "locks": 0, "damaged": 0, "obsolete": 0}
    if not _sound_base(layout):
        return counts

    def old(fd: int, entry: os.DirEntry[str]) -> bool:
        try:
            return clock - os.stat(entry.name, dir_fd=fd, follow_symlinks=False).st_mtime > max_age_s
        except OSError:
            return False

    for path, _ in damaged(root):
        counts["damaged"] += layout.set_aside(path)
    for kind, name in (("staging", "tmp"), ("quarantine", "quarantine")):
        for fd, entry in _each_in(layout, name):
            if old(fd, entry):
                try:
                    _remove_at(fd, entry.name)
                except OSError:
                    continue  # a writer is still busy in it: next time
                counts[kind] += 1
    for fd, tenant in _each_in(layout, "usage"):
        with contextlib.suppress(OSError), _fd(os.open(tenant.name, O_DIR, dir_fd=fd)) as records:
            for entry in entries(records):
                if old(records, entry) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=records)
                        counts["usage"] += 1
    for fd, entry in _each_in(layout, "locks"):
        if old(fd, entry) and _remove_idle_lock(fd, entry.name):
            counts["locks"] += 1
    counts["obsolete"] = _remove_obsolete(layout)
    return counts


def _remove_obsolete(layout: CacheLayout) -> int:
    """Remove the obsolete directories of ``v1``, relative to a descriptor of it. One
    that is not a directory (a planted symlink) was set aside by ``damaged`` already and
    is left alone here; ``rmtree`` by descriptor follows no symlink inside, and fails on
    a directory swapped for one meanwhile."""
    removed = 0
    with contextlib.suppress(OSError), layout.open_dir() as base:
        for name in sorted(OBSOLETE):
            try:
                if not stat.S_ISDIR(os.stat(name, dir_fd=base, follow_symlinks=False).st_mode):
                    continue
                shutil.rmtree(name, dir_fd=base)
            except OSError:
                continue  # absent, or unremovable now: next time
            removed += 1
    return removed


def _remove_idle_lock(locks: int, name: str) -> bool:
    """Delete a lock file nobody holds: taken without waiting, unlinked while held.
    A process that had it open and takes it afterwards finds that its path now names
    another file (or none), and takes that one instead (``fsio.lock_file``): so no
    two processes ever hold "the" lock of a key at once."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=locks)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.stat(name, dir_fd=locks, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(name, dir_fd=locks)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.ENOENT):
            raise
        return False
    finally:
        os.close(fd)


# -- directories by descriptor ----------------------------------------------------
@contextlib.contextmanager
def _fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _each_in(layout: CacheLayout, name: str) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """``(descriptor of <root>/v1/<name>, entry)`` for each entry; none when it is
    absent or not a real directory."""
    try:
        fd = layout.open_dirs((name,))
    except OSError:
        return
    with _fd(fd):
        for entry in entries(fd):
            yield fd, entry


def _remove_at(fd: int, name: str) -> None:
    """Delete the entry ``name`` of the directory ``fd``: a directory with everything in
    it (``shutil.rmtree`` by descriptors, which never follows a symlink), else the entry."""
    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
        shutil.rmtree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def _read_at(fd: int, name: str, limit: int) -> bytes:
    """A regular file of the directory ``fd``, at most ``limit`` bytes (a symlink, a
    FIFO, a device or a larger file is an ``OSError``)."""
    with _fd(os.open(name, _O_READ, dir_fd=fd)) as f:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(f, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        return data


def _kind(entry: os.DirEntry[str]) -> str:
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return "unreadable"
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a file" if stat.S_ISREG(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "?"


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _dirs(path: str, *, skip: frozenset[str] = frozenset()) -> list[os.DirEntry[str]]:
    return [e for e in _entries(path) if e.name not in skip and e.is_dir(follow_symlinks=False)]
