"""A leaf's files written ahead of its publish, while the compiler is still finishing."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future

from .. import faults
from .._background import background
from .fsio import fsync_file, write_file

__all__ = ["EarlyWrite"]


class EarlyWrite:
    """A leaf's files written into its stage ahead of the publish, while the compiler
    that closed the artifact is still finishing: by the caller (whose thread would
    otherwise just wait for the compiler to exit), their writeback started, then
    fsynced on a background thread. The publish finds them written and durable.

    Best effort: a write that fails is undone (the publish then writes the files and
    reports what fails); a later write replaces an earlier one. :meth:`use` is the
    publish's check, and raises the background fsync's error as its own."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        #: Whether an entry of the stage was created or removed here (its directory
        #: then needs an fsync of its own before the publish).
        self.dir_changed = False
        self._lock = threading.Lock()  # held by an fsync; taken to undo what it syncs
        self._gen = 0  # what was written, replaced or undone: a stale fsync is skipped
        self._files: dict[str, bytes] = {}
        self._synced: Future[None] | None = None
        self._used = False

    def write(self, files: dict[str, bytes], *, before_last: str | None = None) -> None:
        """Write ``files`` (name in the stage: bytes, in order) now, and fsync them in the
        background. ``before_last``: a fault point passed before the last file."""
        if self._used or files == self._files:
            return  # the publish has looked already; or written already
        self._undo()
        self._files = dict(files)
        paths = [os.path.join(self.stage, name) for name in files]
        try:
            for i, (path, data) in enumerate(zip(paths, files.values(), strict=True)):
                if before_last is not None and i == len(paths) - 1:
                    faults.point(before_last)
                if not write_file(path, data, prepared=True, sync=False):
                    self.dir_changed = True
        except OSError:
            self._undo()  # no partial file: the publish creates them afresh
            return
        self._synced = background().submit(self._fsync, paths, self._gen)

    def _fsync(self, paths: list[str], gen: int) -> None:
        with self._lock:
            # Only the files this write made: an fsync of files written after it (same
            # names) could take their writeback error, which the kernel reports once.
            if gen == self._gen:
                for path in paths:
                    fsync_file(path)  # its error is the publish's (use)

    def _undo(self) -> None:
        """Remove what was written (once an fsync under way is done; those not yet
        started are skipped)."""
        with self._lock:
            self._gen += 1
            for name in self._files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.stage, name))
                    self.dir_changed = True
            self._files, self._synced = {}, None

    def use(self, files: dict[str, bytes]) -> frozenset[str]:
        """The names of ``files`` written here with exactly those bytes, durably; raises
        ``OSError`` when their fsync failed (a later fsync could succeed without the data
        being safe). Empty when what was written differs from ``files`` (a build compiled
        again, say, made other bytes): then it is gone, for the files to be written afresh."""
        self._used = True
        synced = self._synced
        if synced is not None and all(files.get(name) == data for name, data in self._files.items()):
            synced.result()
            return frozenset(self._files)
        self._undo()
        return frozenset()

    def cancel(self) -> None:
        """Remove what was written (after an fsync under way); later writes are ignored."""
        self._used = True
        self._undo()
