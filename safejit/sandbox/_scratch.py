"""The compiler's scratch: a tmpfs of bounded size (bytes and inodes) that the shim
made in its own mount namespace and mounts on the work dir for the run.

The compiler sees the work dir's path, holding the tmpfs; this process keeps seeing
its own directory there, and reaches the tmpfs through the descriptor the shim
handed over (:attr:`Scratch.view`, ``/proc/self/fd/<n>``; it outlives the shim's
namespace): a watch reads the outputs there as the compiler closes them. The shim
copies what the work dir holds (the staged source, the outputs of an earlier step)
in before the run, and the regular files the compiler left at the top of its
scratch (its outputs) back out after it, before it reports the run's end. Whatever
the compiler writes thus stays within the tmpfs's bounds, however many files it
spreads it over.
"""

from __future__ import annotations

import os

__all__ = ["Scratch"]


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
