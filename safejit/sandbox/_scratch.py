"""The compiler's scratch: a tmpfs of bounded size (bytes and inodes) that the shim
made in its own mount namespace and mounts on the work dir for the run.

The compiler sees the work dir's path, holding the tmpfs; this process keeps seeing
its own directory there, and reaches the tmpfs through the descriptor the shim
handed over (:attr:`Scratch.view`, ``/proc/self/fd/<n>``; it outlives the shim's
namespace). Before the run, what the work dir holds (the staged source, the
outputs of an earlier step) is copied in; after it, the regular files the compiler
left at the top of its scratch (its outputs) are copied out — a file that a watch
read at its last close (and that has not changed since) from those bytes. Whatever
it writes thus stays within the tmpfs's bounds, however many files it spreads it over.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Mapping
from typing import Final

from ..closure.hashing import read_output

__all__ = ["Scratch"]

#: Copied in: at most this many entries, this deep (the work dir is this process's own).
_MAX_ENTRIES: Final = 4096
_MAX_DEPTH: Final = 16
#: Copied out: at most this many files (a compile writes a handful).
MAX_OUTPUTS: Final = 256


class Scratch:
    """The scratch tmpfs, by its root directory's descriptor."""

    def __init__(self, mount_fd: int) -> None:
        try:
            self.fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=mount_fd)
        finally:
            os.close(mount_fd)

    @property
    def view(self) -> str:
        """Where this process reaches the tmpfs."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def fill(self, source: str, owner: tuple[int, int] | None = None) -> None:
        """Copy the directories and regular files under ``source`` in (symlinks and
        anything else are left out); ``owner``: the ids the compiler runs as (this
        process is root), given what is copied."""
        budget = [_MAX_ENTRIES]
        src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _copy_tree(src, self.fd, owner, budget, 0)
        finally:
            os.close(src)

    def give_back(self, dest: str, have: Mapping[str, bytes]) -> None:
        """Copy the regular files at the top of the scratch into ``dest`` (each written
        under a temporary name, then renamed over whatever file was there; never over a
        directory). ``have``: contents already read, by their path in ``dest``."""
        out = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.scandir(self.fd) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
            for name in sorted(names)[:MAX_OUTPUTS]:
                data = have.get(os.path.join(dest, name))
                if data is None:
                    try:
                        data = read_output(os.path.join(self.view, name))
                    except OSError:
                        continue  # (gone, or made something else meanwhile)
                _put(out, name, data)
        finally:
            os.close(out)


def _copy_tree(src: int, dst: int, owner: tuple[int, int] | None, budget: list[int], depth: int) -> None:
    if owner is not None and depth == 0:
        os.fchown(dst, *owner)
    with os.scandir(src) as entries:
        found = list(entries)
    for entry in found:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            raise OSError(f"the work dir holds too much to copy into the scratch: {entry.name}")
        if entry.is_dir(follow_symlinks=False):
            mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            os.mkdir(entry.name, mode, dir_fd=dst)
            sub_src = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
            try:
                sub_dst = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
                try:
                    if owner is not None:
                        os.fchown(sub_dst, *owner)
                    _copy_tree(sub_src, sub_dst, owner, budget, depth + 1)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif entry.is_file(follow_symlinks=False):
            _copy_file(src, dst, entry.name, owner)


def _copy_file(src: int, dst: int, name: str, owner: tuple[int, int] | None) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, stat.S_IMODE(st.st_mode), dir_fd=dst)
        try:
            if owner is not None:
                os.fchown(out, *owner)
            while chunk := os.read(fd, 1 << 20):
                _write_all(out, chunk)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _put(dir_fd: int, name: str, data: bytes) -> None:
    tmp = f".out-{uuid.uuid4().hex[:16]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:  # (a directory of that name: never replaced)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
