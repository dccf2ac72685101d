"""Whole-cache operations: listing, integrity verification, ``check()``.

These walk ``<root>/v1`` without following symlinks and never delete outside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .disk import CORRUPT_REASONS, LAYOUT, MANIFEST, MARKER, DiskCache, Rejection, VerifiedLeaf
from .fsio import remove_tree

__all__ = ["LeafInfo", "PruneReport", "check", "gc", "iter_leaves", "prune", "verify_all"]

_BUILD = re.compile(r"build-([0-9a-f]{64})\Z")
_DEPS = re.compile(r"deps-([0-9a-f]{64})\Z")
_RESERVED = frozenset({"tmp", "locks", "quarantine", "tools", "usage"})


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


def _dirs(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted((e for e in it if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
    except OSError:
        return []


def iter_leaves(root: str) -> Iterator[LeafInfo]:
    base = os.path.join(root, LAYOUT)
    for tenant in _dirs(base):
        if tenant.name in _RESERVED:
            continue
        for backend in _dirs(tenant.path):
            for shard in _dirs(backend.path):
                for build in _dirs(shard.path):
                    bm = _BUILD.match(build.name)
                    if not bm:
                        continue
                    for leaf in _dirs(build.path):
                        dm = _DEPS.match(leaf.name)
                        if not dm:
                            continue
                        size = 0
                        try:
                            for f in _entries(leaf.path):
                                if f.is_file(follow_symlinks=False):
                                    size += f.stat(follow_symlinks=False).st_size
                            mtime = leaf.stat(follow_symlinks=False).st_mtime
                        except OSError:
                            continue
                        yield LeafInfo(
                            root, tenant.name, backend.name, bm.group(1), dm.group(1), leaf.path, size, mtime
                        )


def verify_all(root: str, *, fix: bool = False) -> Iterator[tuple[LeafInfo, Rejection | None]]:
    """Integrity of every leaf (marker, manifest, name, artifact bytes)."""
    for info in iter_leaves(root):
        disk = DiskCache((root,), tenant=info.tenant, backend=info.backend)
        result = disk.verify(info.path, root, info.build_key, None)
        bad = None if isinstance(result, VerifiedLeaf) else result
        if bad is not None and fix and bad.reason in CORRUPT_REASONS:
            disk.quarantine(info.path, root)
        yield info, bad


def check(root: str) -> list[str]:
    """Every consistency problem under ``root``; empty when the cache is sound.

    A sound cache shows no leaf that fails its integrity check, no leaf with
    files other than its own, and no stray entry in the build tree.
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
    base = os.path.join(root, LAYOUT)
    for tenant in _dirs(base):
        if tenant.name in _RESERVED:
            continue
        for backend in _dirs(tenant.path):
            for shard in _dirs(backend.path):
                for build in _dirs(shard.path):
                    if not _BUILD.match(build.name):
                        problems.append(f"{build.path}: not a build directory")
                        continue
                    for entry in _entries(build.path):
                        if not _DEPS.match(entry.name) or not entry.is_dir(follow_symlinks=False):
                            problems.append(f"{entry.path}: stray entry in a build directory")
    return problems


@dataclass(frozen=True, slots=True)
class PruneReport:
    examined: int
    removed: int
    freed: int
    kept_recent: int


def _discard_leaf(root: str, path: str) -> bool:
    """Make a leaf vanish atomically (rename into tmp/), then delete it there."""
    trash = os.path.join(root, LAYOUT, "tmp", f"trash-{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except OSError:
        return False  # already gone, or not ours to move
    remove_tree(trash, within=os.path.join(root, LAYOUT))
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
) -> PruneReport:
    """Delete leaves: older than ``max_age_s``, beyond the ``keep_per_build`` newest
    of their build, then least recently used until under ``max_bytes``.

    A leaf touched within ``grace_s`` is never deleted (a running process may have
    just found it). Leaves vanish by one rename, so readers see a whole leaf or none.
    """
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
        if clock - info.mtime > grace_s and _discard_leaf(root, info.path):
            removed += 1
            freed += info.size
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(info.path))  # the build dir, once empty
        if progress is not None:
            progress(n + 1)
    return PruneReport(len(infos), removed, freed, spared)


def gc(root: str, *, max_age_s: float = 24 * 3600.0, now: float | None = None) -> dict[str, int]:
    """Remove staging residue, quarantined leaves and usage records older than
    ``max_age_s``. Never follows symlinks; never leaves ``<root>/v1``."""
    clock = time.time() if now is None else now
    base = os.path.join(root, LAYOUT)
    # Lock files are never deleted: a process blocked on the old inode would then hold a
    # lock nobody else sees, and two compiles of one key would run at once.
    counts = {"staging": 0, "quarantine": 0, "usage": 0}

    def old(entry: os.DirEntry[str]) -> bool:
        try:
            return clock - entry.stat(follow_symlinks=False).st_mtime > max_age_s
        except OSError:
            return False

    for kind in ("tmp", "quarantine"):
        for entry in _entries(os.path.join(base, kind)):
            if old(entry):
                try:
                    remove_tree(entry.path, within=base)
                except OSError:
                    continue  # a writer is still busy in it: next time
                counts["staging" if kind == "tmp" else "quarantine"] += 1
    for tenant in _dirs(os.path.join(base, "usage")):
        for entry in _entries(tenant.path):
            if old(entry) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                counts["usage"] += 1
    return counts


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
