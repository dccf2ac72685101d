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
(One module past the style's ~450 lines: every operation here walks the same layout
with the same hostile-ground rules, and verify, prune and gc share its findings.)

The descriptor helpers are ``_walk``'s; usage records are read back by ``usage``
(and re-exported here, with the other operations ``safejit`` runs on a root).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from .._proc import claimed, ended, unmade
from ..outcomes import Miss
from ._walk import closing, dirs, each_in, kind_of, read_at, real_layout, remove_at, sorted_entries
from .disk import DiskTier
from .fsio import rmtree_at
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
    in_its_shard,
    is_real_dir,
)
from .leaf import MANIFEST_LIMIT, Manifest, Rejection, VerifiedLeaf, Verifier, decode_manifest
from .statmemo import sweep_memo
from .usage import UsageEntry, read_usage, remove_usage

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


def _sound_base(layout: CacheLayout) -> bool:
    return is_real_dir(layout.base)


def iter_leaves(
    root: str, tenant: str | None = None, backend: str | None = None, *, unreadable: list[LeafPath] | None = None
) -> Iterator[LeafInfo]:
    """The leaves of ``root`` (only ``tenant``'s and ``backend``'s when given); the path of
    each that this user cannot read (another's, private) goes to ``unreadable``."""
    layout = real_layout(root)
    if not _sound_base(layout):
        return
    for found in layout.leaves(tenant, backend):
        info = _info(layout.root, found)
        if info is not None:
            yield info
        elif unreadable is not None and os.path.lexists(found.path):  # (not one pruned meanwhile)
            unreadable.append(found)


def _info(root: str, found: LeafPath) -> LeafInfo | None:
    size = 0
    try:
        with os.scandir(found.path) as it:
            for f in it:
                if f.is_file(follow_symlinks=False):
                    # What it takes on disk, at most its length: a sparse file of any length
                    # in a leaf (a writer of a shared root can add one) would count as that
                    # much, and 'prune --max-bytes' remove every other leaf to make room.
                    st = f.stat(follow_symlinks=False)
                    size += min(st.st_size, st.st_blocks * 512)
        mtime = os.lstat(found.path).st_mtime
    except OSError:
        return None
    return LeafInfo(root, found.tenant, found.backend, found.build_key, found.deps_key, found.path, size, mtime)


def read_manifest(info: LeafInfo) -> Manifest:
    """A leaf's manifest, decoded by the strict schema (``ManifestError``, or
    ``OSError`` when it cannot be read); not verified against the leaf's files."""
    parents = (info.tenant, info.backend, info.build_key[:2], f"build-{info.build_key}", f"deps-{info.deps_key}")
    with real_layout(info.root).open_dir(*parents) as leaf:
        return decode_manifest(read_at(leaf, MANIFEST, MANIFEST_LIMIT))


def damaged(root: str) -> list[tuple[str, str]]:
    """``(path, why)`` of what stands where the layout wants a directory and is not one
    (``v1``, one of its own directories, a tenant, backend, shard, build dir or leaf
    replaced by a file, a symlink or a FIFO), and of entries that belong nowhere in the
    leaf tree."""
    layout = real_layout(root)
    if os.path.lexists(layout.base) and not _sound_base(layout):
        return [(layout.base, "the cache's v1 directory is not a directory (a symlink?)")]
    out: list[tuple[str, str]] = []
    for entry in sorted_entries(layout.base):
        if entry.is_dir(follow_symlinks=False):
            continue
        what = f"the cache's {entry.name} directory" if entry.name in RESERVED else "a tenant directory"
        out.append((entry.path, f"{what} that is not a directory ({kind_of(entry)})"))
    for tenant in dirs(layout.base, skip=RESERVED):
        for backend in sorted_entries(tenant.path):
            if not backend.is_dir(follow_symlinks=False):
                out.append((backend.path, f"a backend directory that is not a directory ({kind_of(backend)})"))
                continue
            for shard in sorted_entries(backend.path):
                if not shard.is_dir(follow_symlinks=False):
                    out.append((shard.path, f"a shard directory that is not a directory ({kind_of(shard)})"))
    for _, _, build in layout.build_dirs():
        if build_key_of(build.name) is None:
            out.append((build.path, "not a build directory"))
            continue
        if not build.is_dir(follow_symlinks=False):
            out.append((build.path, f"a build directory that is not a directory ({kind_of(build)})"))
            continue
        if not in_its_shard(build.path, build.name[len("build-") :]):
            out.append((build.path, "a build directory in another key's shard (no lookup finds it)"))
            continue
        for entry in sorted_entries(build.path):
            if deps_key_of(entry.name) is None:
                out.append((entry.path, "stray entry in a build directory"))
            elif not entry.is_dir(follow_symlinks=False):
                out.append((entry.path, f"a leaf that is not a directory ({kind_of(entry)})"))
    return out


def verify_all(
    root: str,
    *,
    fix: bool = False,
    moved: set[str] | None = None,
    verifier: Verifier | None = None,
    tenant: str | None = None,
) -> Iterator[tuple[LeafInfo, Rejection | None]]:
    """Integrity of every leaf (marker, manifest, name, artifact bytes; the signature of
    ``tenant``'s leaves against ``verifier``, as its processes check it: another tenant's
    keys are its own); with ``fix``, damaged
    leaves — and whatever stands where a leaf or build dir should be — are moved to
    quarantine (the entry itself, never followed), unless what the name holds by then
    is a sound leaf (published again meanwhile); ``moved`` is given the path of each
    that was (one that could not be, in a cache this user may not write, is not). A
    leaf removed meanwhile (prune) is no finding."""
    layout = real_layout(root)
    moved = set() if moved is None else moved
    for path, why in damaged(root):
        if fix and path != layout.base and layout.set_aside(path):
            moved.add(path)
        info = LeafInfo(layout.root, "", "", "", "", path, 0, 0.0)
        yield info, Rejection(Miss.DAMAGED, why, path, layout.root)
    unreadable: list[LeafPath] = []
    for info in iter_leaves(root, unreadable=unreadable):
        # (any size: a leaf larger than some process's limit is still sound, and never set aside)
        disk = DiskTier(
            (layout.root,),
            tenant=info.tenant,
            backend=info.backend,
            verifier=verifier if info.tenant == tenant else None,
            max_artifact_bytes=sys.maxsize,
        )
        result = disk.verify(info.path, layout.root, info.build_key, None)
        bad = None if isinstance(result, VerifiedLeaf) else result
        if bad is not None and bad.reason is Miss.GONE:
            continue
        if bad is not None and bad.reason.corrupt and disk.sound_now(info.path, layout.root):
            bad = None  # (a prune and a publish replaced it while it was read: what is there is sound)
        if bad is None:
            extra = _foreign(info.path)
            if extra:  # (the leaf verifies, but holds what no publish wrote)
                bad = Rejection(Miss.DAMAGED, f"entries no publish makes: {extra[:5]}", info.path, layout.root)
        if bad is not None and fix and bad.reason.corrupt and layout.set_aside(info.path):
            moved.add(info.path)
        yield info, bad
    for leaf in unreadable:  # (not this user's to read: unverified, so a finding, never set aside)
        info = LeafInfo(layout.root, leaf.tenant, leaf.backend, leaf.build_key, leaf.deps_key, leaf.path, 0, 0.0)
        yield info, Rejection(Miss.IO, "this user cannot read the leaf", leaf.path, layout.root)


def check(root: str) -> list[str]:
    """Every consistency problem under ``root``; empty when the cache is sound.

    A sound cache shows no leaf that fails its integrity check, no leaf with
    files other than its own, and no stray or damaged entry in the build tree.
    """
    return [f"{info.path}: {bad.reason}: {bad.detail}" for info, bad in verify_all(root) if bad is not None]


def _foreign(leaf: str) -> list[str]:
    """The entries of a leaf that no publish makes (its marker, manifest and one artifact
    are all it holds), sorted; unreadable: none (verify said what it could)."""
    try:
        names = sorted(os.listdir(leaf))
    except OSError:
        return []
    artifacts = [n for n in names if n.startswith("artifact.")]
    return [n for n in names if n not in (MANIFEST, MARKER) and n not in artifacts[:1]]


def count_entries(root: str, name: str) -> int | None:
    """How many entries ``<root>/v1/<name>`` holds (``tmp``, ``quarantine``...): 0 when
    it is absent, None when it is not a real directory."""
    try:
        with real_layout(root).open_dir(name) as fd:
            return len(os.listdir(fd))
    except FileNotFoundError:
        return 0
    except OSError:
        return None


# -- prune ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PruneReport:
    examined: int
    removed: int
    freed: int
    kept_recent: int
    #: Leaves it meant to remove and could not (a cache this user may not write).
    failed: int = 0


def _discard_leaf(layout: CacheLayout, info: LeafInfo) -> str:
    """Make a leaf vanish atomically (rename into tmp/), then delete it there; the
    build dir too, once empty: ``removed``; ``touched``: left, as it was touched since
    ``info`` was taken (a process found it meanwhile); ``gone`` already; ``failed``: it
    could not be moved (not this user's)."""
    shard = (info.tenant, info.backend, info.build_key[:2])
    build = f"build-{info.build_key}"
    leaf = f"deps-{info.deps_key}"
    trash = f"trash-{uuid.uuid4().hex}"
    try:
        with layout.open_dir(*shard) as shard_fd, layout.open_dir("tmp", make=True) as tmp:
            build_fd = os.open(build, O_DIR, dir_fd=shard_fd)
            try:
                if os.stat(leaf, dir_fd=build_fd, follow_symlinks=False).st_mtime != info.mtime:
                    return "touched"
                os.rename(leaf, trash, src_dir_fd=build_fd, dst_dir_fd=tmp)
            finally:
                os.close(build_fd)
            with contextlib.suppress(OSError):
                os.rmdir(build, dir_fd=shard_fd)  # the build dir, once empty
            with contextlib.suppress(OSError):  # (what is left is staging residue: gc's)
                remove_at(tmp, trash)
    except FileNotFoundError:
        return "gone"  # (another prune's)
    except OSError:
        return "failed"
    return "removed"


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
    layout = real_layout(root)
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
        # (a leaf doomed above but within its grace stays on disk: it counts)
        total = sum(i.size for i in infos if i.path not in doomed or clock - i.mtime <= grace_s)
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
    removed = freed = failed = 0
    for n, info in enumerate(sorted(doomed.values(), key=lambda i: i.mtime)):
        if clock - info.mtime > grace_s:
            # (each leaf's mtime is looked at again just before it goes: one a process
            # found since the walk is as new as that, and stays)
            done = "removed" if dry_run else _discard_leaf(layout, info)
            if done == "removed":
                removed += 1
                freed += info.size
            spared += done == "touched"
            failed += done == "failed"
        if progress is not None:
            progress(n + 1)
    return PruneReport(len(infos), removed, freed, spared, failed)


# -- gc -------------------------------------------------------------------------
_TOKEN = re.compile(r"p[0-9]+\.[0-9a-f]+")


def _owner_alive(places: tuple[str, ...], name: str) -> bool | None:
    """Whether the process that made ``name`` in ``<root>/v1/tmp`` (a work dir
    ``<token>-<uuid>``, or a mark ``<token>.alive``) lives: True while it holds its mark
    (in the first of ``places`` that has it: this user's state dir, the tmp dir), False
    once it has ended; None when that cannot be told (a name made before owner tokens,
    no mark here — another user's, or another host's —): then its age decides."""
    token = name[: -len(".alive")] if name.endswith(".alive") else name.partition("-")[0]
    if not _TOKEN.fullmatch(token):
        return None
    for place in places:
        try:
            if os.lstat(os.path.join(place, token + ".alive")).st_uid != os.geteuid():
                return None
        except OSError:
            continue
        return not ended(place, token)
    return None


def gc(
    root: str, *, max_age_s: float = 24 * 3600.0, now: float | None = None, marks: str | None = None
) -> dict[str, int]:
    """Remove staging residue, quarantined leaves, usage records, idle lock files and
    build dirs no leaf went into older than ``max_age_s``, and the obsolete directories
    of ``v1`` (``OBSOLETE``, whatever their age), and move aside whatever stands where a
    leaf or a build dir should be; in ``marks``, the marks of ended processes and the
    stat memo no lookup can use (``statmemo.sweep_memo``). A work dir a compile uses
    (locked, ``_proc.use``: seen by any user, HOME or process) or whose process lives
    (its owner's mark held, in ``marks`` — the user's private state dir — or in ``tmp``)
    is never removed; one whose process ended is, at once. Never follows symlinks;
    never leaves ``<root>/v1`` (nothing at all when ``v1`` is not a real directory)."""
    clock = time.time() if now is None else now
    counts = {"staging": 0, "quarantine": 0, "usage": 0, "locks": 0, "damaged": 0, "obsolete": 0, "empty": 0}
    layout = real_layout(root)
    if _sound_base(layout):
        _gc_cache(layout, counts, max_age_s, clock, marks)
    if marks:  # (the user's private dir, whatever the cache holds; its marks after the work dirs they vouch for)
        _remove_ended_marks(marks)
        sweep_memo(marks, max_age_s=max_age_s, now=clock)
    return counts


def _gc_cache(layout: CacheLayout, counts: dict[str, int], max_age_s: float, clock: float, marks: str | None) -> None:
    """:func:`gc`'s work in the cache (its ``v1`` a real directory)."""

    def old(fd: int, entry: os.DirEntry[str]) -> bool:
        return _older(fd, entry, clock, max_age_s)

    for path, _ in damaged(layout.root):
        counts["damaged"] += layout.set_aside(path)
    for kind, name in (("staging", "tmp"), ("quarantine", "quarantine")):
        for fd, entry in each_in(layout, name):
            alive = _owner_alive((*([marks] if marks else []), layout.tmp), entry.name) if kind == "staging" else None
            if alive:
                continue  # (a compile under way, however long it has run)
            if alive is False or old(fd, entry):
                try:
                    with claimed(fd, entry.name) as free:
                        if not free:
                            continue  # a compile uses it (whoever's, wherever its mark is)
                        remove_at(fd, entry.name)
                except OSError:
                    continue  # a writer is still busy in it (or it cannot be removed): next time
                counts[kind] += 1
    for fd, tenant in each_in(layout, "usage"):
        with contextlib.suppress(OSError), closing(os.open(tenant.name, O_DIR, dir_fd=fd)) as records:
            for entry in entries(records):
                # (a writer's temporary, between its write and its rename, is no garbage at
                # any age asked for: removed, it made that Runtime's close fail)
                if entry.name.startswith(".") and not _older(records, entry, clock, max(max_age_s, TEMP_GRACE_S)):
                    continue
                if old(records, entry) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=records)
                        counts["usage"] += 1
    for fd, entry in each_in(layout, "locks"):
        if old(fd, entry) and _remove_idle_lock(fd, entry.name):
            counts["locks"] += 1
    counts["obsolete"] = _remove_obsolete(layout)
    counts["empty"] = _remove_empty_builds(layout, old)


#: The least age at which gc takes a writer's temporary (a usage record's) for one left by
#: a writer that died: a live one exists for the moment between a write and a rename.
TEMP_GRACE_S: Final = 60.0


def _older(fd: int, entry: os.DirEntry[str], clock: float, age_s: float) -> bool:
    try:
        return clock - os.stat(entry.name, dir_fd=fd, follow_symlinks=False).st_mtime > age_s
    except OSError:
        return False


def _remove_ended_marks(place: str) -> None:
    """The marks in ``place`` of processes that ended without removing theirs (killed),
    and those one killed while making its mark left (``_proc.unmade``)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(place):
            token = name.removesuffix(".alive")
            if (token != name and _TOKEN.fullmatch(token) and ended(place, token)) or unmade(place, name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(place, name))


def _remove_empty_builds(layout: CacheLayout, old: Callable[[int, os.DirEntry[str]], bool]) -> int:
    """Remove the build dirs left empty (``old`` ones): made when a compile began, and kept
    by none that failed, was killed or was not published. One a publish has just filled is
    not empty (``rmdir`` fails); one emptied under a publish about to fill it makes the
    publish make it again."""
    removed = 0
    for tenant, backend, build in layout.build_dirs():
        if build_key_of(build.name) is None:
            continue
        shard = os.path.basename(os.path.dirname(build.path))
        with contextlib.suppress(OSError), layout.open_dir(tenant, backend, shard) as fd:
            if old(fd, build) and stat.S_ISDIR(os.stat(build.name, dir_fd=fd, follow_symlinks=False).st_mode):
                os.rmdir(build.name, dir_fd=fd)
                removed += 1
    return removed


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
                rmtree_at(base, name)
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
    except OSError:  # (held; gone; or not this user's to remove, another's in a shared root: next time)
        return False
    finally:
        os.close(fd)
