"""Every on-disk path shape of a cache root, in one place (DESIGN.md §5)::

    <root>/v1/tmp/<uuid>/                       staging and compile work dirs
    <root>/v1/locks/<build_key>.lock
    <root>/v1/quarantine/<stamp>-<id>/          leaves that failed verification
    <root>/v1/usage/<tenant>/<record>.json      per-process counters (safejit stats)
    <root>/v1/<tenant>/<backend>/<K[:2]>/build-<K>/deps-<D>/
          artifact.<ext>   manifest.json   .committed

:meth:`CacheLayout.leaves` walks the leaf tree without following a symlink;
:meth:`CacheLayout.open_dir` and :meth:`CacheLayout.set_aside` reach a directory, and
move an entry into quarantine, through descriptors opened without following one.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from .. import faults
from .fsio import group_writable, mkdir_shared

__all__ = [
    "MANIFEST",
    "MARKER",
    "OBSOLETE",
    "RESERVED",
    "VERSION",
    "CacheLayout",
    "LeafPath",
    "artifact_file",
]

VERSION: Final = "v1"
MARKER: Final = ".committed"
MANIFEST: Final = "manifest.json"
#: Names under ``v1/`` that are not tenants.
RESERVED: Final = frozenset({"tmp", "locks", "quarantine", "tools", "usage"})
#: Those no version writes any more, which ``gc`` removes: ``tools`` held the sandbox's
#: shims and the toolchain probes, which now live in the user's private state dir (a
#: cache is data, never code).
OBSOLETE: Final = frozenset({"tools"})
#: A directory opened without following a symlink (ELOOP/ENOTDIR when it is not a real one).
O_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_BUILD: Final = re.compile(r"build-([0-9a-f]{64})\Z")
_DEPS: Final = re.compile(r"deps-([0-9a-f]{64})\Z")


def artifact_file(ext: str) -> str:
    """A leaf's artifact name (``artifact.so``, ``artifact.cubin``...)."""
    return f"artifact.{ext}"


@dataclass(frozen=True, slots=True)
class LeafPath:
    """A leaf found by :meth:`CacheLayout.leaves` (its directory entry, not yet verified)."""

    tenant: str
    backend: str
    build_key: str
    deps_key: str
    path: str


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The paths of one cache root. ``root`` is the resolved root directory."""

    root: str

    @property
    def base(self) -> str:
        return os.path.join(self.root, VERSION)

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, VERSION, "tmp")

    @property
    def locks(self) -> str:
        return os.path.join(self.root, VERSION, "locks")

    @property
    def quarantine(self) -> str:
        return os.path.join(self.root, VERSION, "quarantine")

    @property
    def usage(self) -> str:
        return os.path.join(self.root, VERSION, "usage")

    def usage_dir(self, tenant: str) -> str:
        return os.path.join(self.root, VERSION, "usage", tenant)

    def lock(self, build_key: str) -> str:
        return os.path.join(self.root, VERSION, "locks", f"{build_key}.lock")

    def build_dir(self, tenant: str, backend: str, build_key: str) -> str:
        return os.path.join(self.root, VERSION, tenant, backend, build_key[:2], f"build-{build_key}")

    def leaf(self, tenant: str, backend: str, build_key: str, deps_key: str) -> str:
        return os.path.join(self.build_dir(tenant, backend, build_key), f"deps-{deps_key}")

    def within(self, path: str) -> bool:
        """Whether ``path`` lies lexically under ``<root>/v1`` (deletion stays inside it)."""
        base = self.base.rstrip("/") + "/"
        return os.path.normpath(path).startswith(base)

    # -- by descriptor -----------------------------------------------------------
    def open_dirs(self, parts: tuple[str, ...], *, make: bool = False) -> int:
        """A descriptor of ``<root>/v1/<parts…>``, each component opened without following
        a symlink (``ELOOP``/``ENOTDIR`` when one is not a real directory); with ``make``,
        the last one is made when absent."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            names = (VERSION, *parts)
            for n, part in enumerate(names):
                if make and n == len(names) - 1:
                    with contextlib.suppress(FileExistsError):
                        mkdir_shared(part, dir_fd=fd, group=group_writable(self.root))
                nxt = os.open(part, O_DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def open_dir(self, *parts: str, make: bool = False) -> Iterator[int]:
        """:meth:`open_dirs` for a ``with`` block (closed at its end)."""
        fd = self.open_dirs(parts, make=make)
        try:
            yield fd
        finally:
            os.close(fd)

    def set_aside(self, path: str) -> bool:
        """Move the entry ``path`` (under ``<root>/v1``) into quarantine, renamed relative
        to descriptors of its parent and of the quarantine (a symlink planted anywhere on
        either way is never followed); one of v1's own directories that is not a
        directory is removed instead (it holds nothing of the cache). False when it
        could not be done."""
        rel = os.path.relpath(path, self.base).split(os.sep)
        if not self.within(path) or ".." in rel:
            return False
        *parents, name = rel
        try:
            with self.open_dir(*parents) as src:
                if not parents and name in RESERVED:
                    os.unlink(name, dir_fd=src)
                    return True
                with self.open_dir("quarantine", make=True) as quarantine:
                    stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
                    faults.point("disk.rename")
                    os.rename(name, stamp, src_dir_fd=src, dst_dir_fd=quarantine)
                    # (aged from now, not from its last write: gc keeps it its full age)
                    with contextlib.suppress(OSError):
                        os.utime(stamp, dir_fd=quarantine, follow_symlinks=False)
        except OSError:
            return False
        return True

    # -- walking ---------------------------------------------------------------
    def build_dirs(
        self, tenant_only: str | None = None, backend_only: str | None = None
    ) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
        """``(tenant, backend, entry)`` for every entry of the shard level — build dirs
        and strays alike (the caller tells them apart with :func:`build_key_of`); only
        under ``tenant_only`` and ``backend_only`` when given."""
        for tenant in _dirs(self.base):
            if tenant.name in RESERVED or tenant_only not in (None, tenant.name):
                continue
            for backend in _dirs(tenant.path):
                if backend_only not in (None, backend.name):
                    continue
                for shard in _dirs(backend.path):
                    for entry in entries(shard.path):
                        yield tenant.name, backend.name, entry

    def leaves(self, tenant_only: str | None = None, backend_only: str | None = None) -> Iterator[LeafPath]:
        """Every ``deps-<D>`` directory of every ``build-<K>`` directory (real directories
        only; a symlink standing in for either is not followed); only under
        ``tenant_only`` and ``backend_only`` when given."""
        for tenant, backend, build in self.build_dirs(tenant_only, backend_only):
            key = build_key_of(build.name)
            if key is None or not build.is_dir(follow_symlinks=False) or not in_its_shard(build.path, key):
                continue
            for leaf in entries(build.path):
                deps = deps_key_of(leaf.name)
                if deps is not None and leaf.is_dir(follow_symlinks=False):
                    yield LeafPath(tenant, backend, key, deps, leaf.path)


def in_its_shard(build_path: str, key: str) -> bool:
    """Whether a build dir lies in the shard its key names (where lookups look for it)."""
    return os.path.basename(os.path.dirname(build_path)) == key[:2]


def build_key_of(name: str) -> str | None:
    m = _BUILD.match(name)
    return m.group(1) if m else None


def deps_key_of(name: str) -> str | None:
    m = _DEPS.match(name)
    return m.group(1) if m else None


def is_real_dir(path: str) -> bool:
    """A directory, and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def entries(where: str | int) -> list[os.DirEntry[str]]:
    """The entries of a directory (by path or descriptor), by name; none when it cannot
    be read."""
    try:
        with os.scandir(where) as it:  # (a descriptor yields str names too)
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _dirs(path: str) -> list[os.DirEntry[str]]:
    return [e for e in entries(path) if e.is_dir(follow_symlinks=False)]
