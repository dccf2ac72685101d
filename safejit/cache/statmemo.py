"""A per-user, per-boot memory of the stat snapshots a leaf's dependencies had
when they last verified by a full rehash.

A later verification in any process of the same user on the same boot may
trust an unchanged ``(dev, ino, size, mtime_ns, ctime_ns)`` instead of
rehashing — the rule the memory tier already applies within a process
(DESIGN.md §6), made persistent. Snapshots that were racily close to the time
they were taken are never recorded. The memo lives in a private directory
(``sandbox.statedir``: 0700, owned by the user, outside every cache root) and is
keyed by the kernel's boot id, so neither another user nor another machine sharing
the cache can feed it. A record that is not a regular file of this user's, or that
others may write, is never read.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Sequence

from ..closure.hashing import Snapshot, digest_bytes, is_racy

__all__ = ["StatMemo", "boot_id"]


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:  # bytes: no codec lookup on the hot path
            return fh.read().strip().replace(b"-", b"")[:32].decode("ascii", "replace")
    except OSError:
        return ""


class StatMemo:
    def __init__(self, private_dir: str) -> None:
        boot = boot_id()
        self.directory = os.path.join(private_dir, f"stat-{boot}") if boot else ""

    def _path(self, leaf: str) -> str:
        return os.path.join(self.directory, digest_bytes(leaf.encode())[:40] + ".json")

    def lookup(self, leaf: str, deps_key: str) -> list[Snapshot] | None:
        if not self.directory:
            return None
        try:
            fd = os.open(self._path(leaf), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, "rb") as fh:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    return None
                data = json.loads(fh.read())
            if data["leaf"] != leaf or data["deps_key"] != deps_key:
                return None
            return [(s[0], s[1], s[2], s[3], s[4]) for s in data["snaps"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record(self, leaf: str, deps_key: str, snaps: Sequence[Snapshot]) -> None:
        if not self.directory:
            return
        now = time.time_ns()
        if any(is_racy(s, now) for s in snaps):
            return
        path = self._path(leaf)
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "w", encoding="ascii") as fh:
                json.dump({"leaf": leaf, "deps_key": deps_key, "snaps": [list(s) for s in snaps]}, fh)
            os.replace(tmp, path)
