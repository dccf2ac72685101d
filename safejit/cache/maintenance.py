"""Whole-cache operations: listing, integrity verification, ``check()``, prune, gc.

A cache root is hostile ground (others write it): these walk ``<root>/v1`` without
following a symlink, never delete outside it (nor through a ``v1`` that is itself a
symlink), and report what they cannot read as findings instead of failing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..outcomes import Miss
from .disk import DiskTier
from .fsio import remove_tree
from .layout import MANIFEST, MARKER, CacheLayout, LeafPath, build_key_of, deps_key_of, is_real_dir
from .leaf import Rejection, VerifiedLeaf

__all__ = ["LeafInfo", "PruneReport", "check", "damaged", "gc", "iter_leaves", "prune", "verify_all"]


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


def damaged(root: str) -> list[tuple[str, str]]:
    """``(path, why)`` of what stands where the layout wants a directory and is not one
    (a ``v1``, build dir or leaf replaced by a file or a symlink), and of entries that
    belong nowhere in the leaf tree."""
    layout = _layout(root)
    if os.path.lexists(layout.base) and not _sound_base(layout):
        return [(layout.base, "the cache's v1 directory is not a directory (a symlink?)")]
    out: list[tuple[str, str]] = []
    for _, _, build in layout.build_dirs():
        if build_key_of(build.name) is None:
            out.append((build.path, "not a build directory"))
            continue
        if not build.is_dir(follow_symlinks=False):
            out.append((build.path, "a build directory that is not a directory"))
            continue
        with contextlib.suppress(OSError), os.scandir(build.path) as it:
            for entry in it:
                if deps_key_of(entry.name) is None:
                    out.append((entry.path, "stray entry in a build directory"))
                elif not entry.is_dir(follow_symlinks=False):
                    out.append((entry.path, "a leaf that is not a directory"))
    return out


def verify_all(root: str, *, fix: bool = False) -> Iterator[tuple[LeafInfo, Rejection | None]]:
    """Integrity of every leaf (marker, manifest, name, artifact bytes); with ``fix``,
    damaged leaves — and whatever stands where a leaf or build dir should be — are
    moved to quarantine (the entry itself, never followed)."""
    layout = _layout(root)
    for path, why in damaged(root):
        if fix and path != layout.base:
            DiskTier((layout.root,), tenant="", backend="").quarantine(path, layout.root)
        info = LeafInfo(layout.root, "", "", "", "", path, 0, 0.0)
        yield info, Rejection(Miss.DAMAGED, why, path, layout.root)
    for info in iter_leaves(root):
        disk = DiskTier((layout.root,), tenant=info.tenant, backend=info.backend)
        result = disk.verify(info.path, layout.root, info.build_key, None)
        bad = None if isinstance(result, VerifiedLeaf) else result
        if bad is not None and fix and bad.reason.corrupt:
            disk.quarantine(info.path, layout.root)
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


@dataclass(frozen=True, slots=True)
class PruneReport:
    examined: int
    removed: int
    freed: int
    kept_recent: int


def _discard_leaf(layout: CacheLayout, path: str) -> bool:
    """Make a leaf vanish atomically (rename into tmp/), then delete it there."""
    trash = os.path.join(layout.tmp, f"trash-{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except OSError:
        return False  # already gone, or not ours to move
    remove_tree(trash, within=layout.base)
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
        if clock - info.mtime > grace_s and (dry_run or _discard_leaf(layout, info.path)):
            removed += 1
            freed += info.size
            if not dry_run:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(info.path))  # the build dir, once empty
        if progress is not None:
            progress(n + 1)
    return PruneReport(len(infos), removed, freed, spared)


def gc(root: str, *, max_age_s: float = 24 * 3600.0, now: float | None = None) -> dict[str, int]:
    """Remove staging residue, quarantined leaves, usage records and idle lock files
    older than ``max_age_s``, and move aside whatever stands where a leaf or a build
    dir should be. Never follows symlinks; never leaves ``<root>/v1`` (nothing at all
    when ``v1`` is not a real directory)."""
    layout = _layout(root)
    clock = time.time() if now is None else now
    counts = {"staging": 0, "quarantine": 0, "usage": 0, "locks": 0, "damaged": 0}
    if not _sound_base(layout):
        return counts

    def old(entry: os.DirEntry[str]) -> bool:
        try:
            return clock - entry.stat(follow_symlinks=False).st_mtime > max_age_s
        except OSError:
            return False

    for path, _ in damaged(root):
        DiskTier((layout.root,), tenant="", backend="").quarantine(path, layout.root)
        counts["damaged"] += 1
    for kind, where in (("staging", layout.tmp), ("quarantine", layout.quarantine)):
        for entry in _entries(where):
            if old(entry):
                try:
                    remove_tree(entry.path, within=layout.base)
                except OSError:
                    continue  # a writer is still busy in it: next time
                counts[kind] += 1
    for tenant in _entries(layout.usage):
        if not tenant.is_dir(follow_symlinks=False):
            continue
        for entry in _entries(tenant.path):
            if old(entry) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    counts["usage"] += 1
    for entry in _entries(layout.locks):
        if old(entry) and _remove_idle_lock(entry.path):
            counts["locks"] += 1
    return counts


def _remove_idle_lock(path: str) -> bool:
    """Delete a lock file nobody holds: taken without waiting, unlinked while held.
    A process that had it open and takes it afterwards finds that its path now names
    another file (or none), and takes that one instead (``fsio.lock_file``): so no
    two processes ever hold "the" lock of a key at once."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.ENOENT):
            raise
        return False
    finally:
        os.close(fd)


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
