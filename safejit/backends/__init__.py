"""Backends, each behind the :class:`~safejit.backends.base.Backend` protocol.

- ``base``: the protocol, ``CompileContext`` and what a compile returns.
- ``host``: C/C++ through the system compiler, loaded with ctypes (the default);
  ``_host_library``: loading its artifact from the verified bytes (sealed memfd, dlopen).
- ``cuda/``: NVRTC and nvcc to cubins; ``ascend/``: bisheng + ld.lld, CANN's runtime.
- ``fake``: no compiler at all — for tests of the pipeline and of users' own code.
- ``_argv``: running a compiler argv in a work dir (the work dir's file names);
  ``_toolreads``: what the assembler and the linker read, from the lists they write;
  ``_compilerlog``: a compiler's log in the user's terms (a file it could not open said
  alike, there or refused; where it was looked for);
  ``_toolchain``: probing toolchains, remembered per user.
"""

from __future__ import annotations

from .base import Backend, CompileOutput, LoadedLibrary, Runner

__all__ = ["Backend", "CompileOutput", "LoadedLibrary", "Runner", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called ``name`` (imported lazily: CUDA and CANN stay unloaded)."""
    if name == "host":
        from .host import HostBackend

        return HostBackend(**options)  # type: ignore[arg-type]
    if name == "ascend":
        from .ascend.backend import AscendBackend

        return AscendBackend(**options)  # type: ignore[arg-type]
    if name == "fake":
        from .fake import FakeBackend

        return FakeBackend(**options)
    if name == "cuda":
        from .cuda.backend import CudaBackend

        return CudaBackend(**options)  # type: ignore[arg-type]
    from ..errors import ConfigError

    raise ConfigError(f"backend {name!r} is not available in this build")
