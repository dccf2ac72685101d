"""Loading a host artifact from its verified bytes: a sealed memfd, dlopened under a
unique name (:class:`HostLibrary`), so that what is mapped is exactly the bytes that
were verified and the dynamic loader never hands back another library of the same name."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

from ..errors import LoadError

__all__ = ["HostLibrary"]

_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def _unique_name(fd: int) -> str:
    """A path to the descriptor ``fd`` that no other load in this process was given.

    The dynamic loader hands back a library already loaded when it was given the same
    name (glibc compares the text), and ``/proc/self/fd/N`` names come back as
    descriptor numbers do. 64 random bits are spelled in the separators before ``fd``,
    ``/.`` for a one and ``//`` for a zero, which the kernel reads alike: no file is
    made anywhere (a symlink in a private directory cost ~0.1 ms per process, and a
    directory to sweep after processes that died), and no counter is kept, which a
    second copy of this module (a subinterpreter's, a reload) would start again.
    """
    bits = int.from_bytes(os.urandom(8))
    return "/proc/self" + "".join("/." if bits >> bit & 1 else "//" for bit in range(64)) + f"/fd/{fd}"


class HostLibrary:
    """A shared object loaded from bytes through a sealed memfd.

    Each load is given a name no other load of this process had
    (:func:`_unique_name`); the mapped bytes are the memfd's: exactly the verified
    bytes.
    """

    def __init__(self, artifact: bytes, name: str, signatures: Mapping[str, Any] | None = None) -> None:
        #: Each kernel's prototype as the manifest keeps it (``.ret``, ``.params``, ``.varargs``).
        self.signatures: Mapping[str, Any] = signatures or {}
        started = time.perf_counter()
        fd = os.memfd_create(f"safejit-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(artifact)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self._lib: ctypes.CDLL | None = ctypes.CDLL(_unique_name(fd), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            # Unloaded once nothing holds it, never before: each function taken from it
            # (a kernel, a call under way) holds the library object.
            weakref.finalize(self._lib, _dlclose, self._lib._handle)
        except OSError as exc:
            raise LoadError(f"{name}: dlopen of the verified artifact failed: {exc}", name=name) from exc
        finally:
            os.close(fd)
        self.seconds = time.perf_counter() - started

    def function(self, name: str, **options: Any) -> Any:
        lib = self._lib  # (read once: a close between a check and the use made it None[name])
        if lib is None:
            raise LoadError("library is closed")
        return lib[name]

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
