"""Whole-cache operations: listing, integrity verification, ``check()``.

These walk ``<root>/v1`` without following symlinks and never delete outside it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .disk import LAYOUT, MANIFEST, MARKER, DiskCache, Rejection, VerifiedLeaf

__all__ = ["LeafInfo", "check", "iter_leaves", "verify_all"]

_BUILD = re.compile(r"build-([0-9a-f]{64})\Z")
_DEPS = re.compile(r"deps-([0-9a-f]{64})\Z")
_RESERVED = frozenset({"tmp", "locks", "quarantine", "tools"})


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
        return sorted((e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
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
                            for f in os.scandir(leaf.path):
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
        if bad is not None and fix:
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
                    for entry in os.scandir(build.path):
                        if not _DEPS.match(entry.name) or not entry.is_dir(follow_symlinks=False):
                            problems.append(f"{entry.path}: stray entry in a build directory")
    return problems
