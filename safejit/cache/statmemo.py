"""A per-user, per-boot memory of the states a leaf's closure had when it last
verified by a full check: each dependency's stat snapshot, and the identity and last
change of the deepest existing directory above each negative lookup.

A later verification in any process of the same user on the same boot may trust an
unchanged ``(dev, ino, size, mtime_ns, ctime_ns)`` instead of rehashing, and an
unchanged directory instead of looking up every absent path below it — the rule the
memory tier already applies within a process (DESIGN.md §6), made persistent.
Snapshots that were racily close to the time they were taken are never recorded
(numbered, the events this guards against)::

    1. a file is hashed at time T, its stat S taken before its bytes were read;
    2. it is written again within the same timestamp tick as S: its stat stays S;
    3. a later verification sees S unchanged and trusts the old digest — stale.

Step 3 cannot happen for a snapshot whose mtime and ctime lie more than
``RACY_WINDOW_NS`` (2 s, far above any filesystem's tick) before the time it was
taken: any later write gives the file a later ctime. The memo lives in a private
directory (``sandbox.statedir``: 0700, owned by the user, outside every cache root)
and is keyed by the kernel's boot id, so neither another user nor another machine
sharing the cache can feed it. A record that is not a regular file of this user's,
or that others may write, is never read.
"""

from __future__ import annotations

import contextlib
import operator
import os
import stat
import time

import msgspec

from ..closure.hashing import Snapshot, digest_bytes, is_racy
from .fsio import rmtree_at
from .leaf import MemoRecord

__all__ = ["StatMemo", "boot_id", "sweep_memo"]


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:  # bytes: no codec lookup on the hot path
            return fh.read().strip().replace(b"-", b"")[:32].decode("ascii", "replace")
    except OSError:
        return ""


class _Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    leaf: str
    deps_key: str
    roots: str
    #: The dependencies' paths, NUL-separated (no path holds one), and the digest of their
    #: stats: one string and one digest to decode, where lists took 0.5-1.5 ms for a
    #: thousand headers (the stats are compared by digest, against theirs now).
    paths: str
    snaps: str
    dirs: list[tuple[str, tuple[int, int, int, int, int]]]


_DECODER = msgspec.json.Decoder(_Record)
_ENCODER = msgspec.json.Encoder()
_SNAPS = msgspec.msgpack.Encoder()
#: ``snapshot_of``, as one C call.
_SNAPSHOT = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def _digest(snaps: list[Snapshot]) -> str:
    return digest_bytes(_SNAPS.encode(snaps))


def _unchanged(paths: list[str], recorded: str) -> list[Snapshot] | None:
    """The stats of ``paths`` now, if they are as recorded; None if one moved or is gone.
    lstat: a dependency replaced by a symlink is a changed one (its target is not what
    was confined when it was hashed)."""
    try:
        now = list(map(_SNAPSHOT, map(os.lstat, paths)))  # (in C: ~1.3 us a row less)
    except (OSError, ValueError):
        return None
    return now if _digest(now) == recorded else None


class StatMemo:
    """The memo in ``private_dir`` (this user's, 0700): one small file per leaf."""

    def __init__(self, private_dir: str) -> None:
        boot = boot_id()
        self.directory = os.path.join(private_dir, f"stat-{boot}") if boot else ""

    def _path(self, leaf: str) -> str:
        return os.path.join(self.directory, digest_bytes(leaf.encode())[:40] + ".json")

    def lookup(self, leaf: str, deps_key: str, roots: str) -> MemoRecord | None:
        if not self.directory:
            return None
        try:
            fd = os.open(self._path(leaf), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    return None
                # One read of the size stat gave (a record is replaced by rename, never
                # rewritten in place: a short read is a torn record, refused by the decoder).
                raw = os.read(fd, st.st_size)
            finally:
                os.close(fd)
            data = _DECODER.decode(raw)
        except (OSError, msgspec.DecodeError):
            return None
        if (data.leaf, data.deps_key, data.roots) != (leaf, deps_key, roots):
            return None
        paths = data.paths.split("\0") if data.paths else []
        return MemoRecord(paths, _unchanged(paths, data.snaps), data.dirs)

    def record(self, leaf: str, deps_key: str, roots: str, record: MemoRecord, now: int | None = None) -> None:
        """Keep ``record`` unless a stat in it is racy as of ``now`` (wall ns; default: now):
        the time its file was read, or earlier, not when the check that read it ended."""
        if not self.directory:
            return
        now = time.time_ns() if now is None else now
        snaps = record.snaps
        if snaps is None or len(snaps) != len(record.paths) or any(is_racy(s, now) for s in snaps):
            return
        dirs: list[tuple[str, Snapshot]] = [] if any(is_racy(s, now) for _, s in record.dirs) else record.dirs
        path = self._path(leaf)
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            data = _Record(leaf, deps_key, roots, "\0".join(record.paths), _digest(snaps), dirs)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as fh:
                fh.write(_ENCODER.encode(data))
            os.replace(tmp, path)


#: A record's temporary file older than this was left by a process killed while writing it.
_TMP_LEFT_S = 60.0


def sweep_memo(private_dir: str, *, max_age_s: float, now: float) -> int:
    """Remove what no lookup can use any more (``safejit gc``): the memos of other boots
    not written within ``max_age_s`` (each boot starts one of its own; a home shared
    between nodes holds their live ones too), the records of leaves no longer there,
    the records of remote leaves not written again within ``max_age_s``, and temporary
    files killed writers left. How many entries went."""
    boot = boot_id()
    removed = 0
    with contextlib.suppress(OSError), os.scandir(private_dir) as it:
        stale = [
            e.name
            for e in it
            if e.name.startswith("stat-")
            and e.name != f"stat-{boot}"
            and now - e.stat(follow_symlinks=False).st_mtime > max_age_s
        ]
    for name in stale:
        with contextlib.suppress(OSError):
            fd = os.open(private_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    rmtree_at(fd, name)
                    removed += 1
            finally:
                os.close(fd)
    if not boot:
        return removed
    current = os.path.join(private_dir, f"stat-{boot}")
    with contextlib.suppress(OSError), os.scandir(current) as it:
        for entry in it:
            if _useless(entry, max_age_s, now):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def _useless(entry: os.DirEntry[str], max_age_s: float, now: float) -> bool:
    st = entry.stat(follow_symlinks=False)
    if entry.name.endswith(".tmp"):
        return now - st.st_mtime > _TMP_LEFT_S
    if not entry.name.endswith(".json") or not stat.S_ISREG(st.st_mode):
        return False
    try:
        with open(os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as fh:
            leaf = _DECODER.decode(fh.read(st.st_size)).leaf
    except (OSError, msgspec.DecodeError):
        return True  # (no lookup can use it either)
    if os.path.isabs(leaf):
        return not os.path.lexists(leaf)
    return now - st.st_mtime > max_age_s  # (a remote leaf's: nothing local to look at)
