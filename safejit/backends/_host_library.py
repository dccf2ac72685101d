"""Loading a host artifact from its verified bytes: a sealed memfd, dlopened under a
unique name (:class:`HostLibrary`), so that what is mapped is exactly the bytes that
were verified and the dynamic loader never hands back another library of the same name."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import stat
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Final

from .. import _forksafe
from .._proc import owner, sweep
from ..errors import LoadError

__all__ = ["HostLibrary"]

_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL

_loader_lock = _forksafe.Lock()
_loader: tuple[int, str] | None = None


def _loader_dir() -> str:
    """A private directory for the unique names libraries are loaded under (per process).

    On tmpfs when there is one: only symlinks live here, each for the moment of a
    dlopen (the bytes are a memfd), and creating them on a disk filesystem costs
    ~0.3 ms each. It is removed at exit; those of processes that died are removed
    by the next process that makes one.
    """
    global _loader
    with _loader_lock:
        if _loader is None or _loader[0] != os.getpid() or not os.path.isdir(_loader[1]):
            parent = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else tempfile.gettempdir()
            prefix = f"safejit-load-u{os.geteuid()}-"
            # (what processes that ended left: marked by their owner, not by a pid,
            # which another PID namespace sharing this directory would take for dead)
            sweep(parent, prefix, _remove_loader_dir)
            path = _private_dir(parent, f"{owner(parent, prefix)}-")
            atexit.register(_remove_empty_dir, path, os.getpid())
            _loader = (os.getpid(), path)
        return _loader[1]


def _private_dir(parent: str, prefix: str) -> str:
    """A new directory of ours (0700) under ``parent``, by an unguessable name: what
    ``tempfile.mkdtemp`` makes, at a sixth of its cost in a new process."""
    while True:
        path = os.path.join(parent, prefix + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


def _remove_loader_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        # Our own real directory only (anyone can make a name in /dev/shm).
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            for link in os.listdir(path):  # symlinks an ended process left
                os.unlink(os.path.join(path, link))
            os.rmdir(path)


def _remove_empty_dir(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.rmdir(path)


class HostLibrary:
    """A shared object loaded from bytes through a sealed memfd.

    The dynamic loader deduplicates libraries *by the name passed to dlopen*,
    and ``/proc/self/fd/N`` names are reused as fd numbers are; so each load
    goes through a uniquely named symlink (in a private directory) to the
    memfd. The mapped bytes are the memfd's: exactly the verified bytes.
    """

    def __init__(self, artifact: bytes, name: str, signatures: Mapping[str, Any] | None = None) -> None:
        #: Each kernel's prototype as the manifest keeps it (``.ret``, ``.params``, ``.varargs``).
        self.signatures: Mapping[str, Any] = signatures or {}
        started = time.perf_counter()
        fd = os.memfd_create(f"safejit-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        link = os.path.join(_loader_dir(), f"{uuid.uuid4().hex}.so")
        try:
            view = memoryview(artifact)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            os.symlink(f"/proc/{os.getpid()}/fd/{fd}", link)
            self._lib: ctypes.CDLL | None = ctypes.CDLL(link, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            # Unloaded once nothing holds it, never before: each function taken from it
            # (a kernel, a call under way) holds the library object.
            weakref.finalize(self._lib, _dlclose, self._lib._handle)
        except OSError as exc:
            raise LoadError(f"{name}: dlopen of the verified artifact failed: {exc}", name=name) from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(link)
            os.close(fd)
        self.seconds = time.perf_counter() - started

    def function(self, name: str, **options: Any) -> Any:
        if self._lib is None:
            raise LoadError("library is closed")
        return self._lib[name]

    def signature(self, name: str) -> Any:
        """The prototype the build recorded for ``name`` (None: none was recorded)."""
        return self.signatures.get(name)

    def close(self) -> None:
        """Let the library go: it is unloaded as soon as no function of it is held — at
        once when no kernel was made of it, else once its kernels are gone (a call under
        way ends first: unloading the code under it crashed the process)."""
        self._lib = None


def _dlclose(handle: int) -> None:
    import _ctypes

    with contextlib.suppress(OSError):
        _ctypes.dlclose(handle)
