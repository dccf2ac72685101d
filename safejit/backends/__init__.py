"""Backends: host (C/C++ via the system compiler), cuda, ascend."""

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
    if name == "cuda":
        from .cuda.backend import CudaBackend

        return CudaBackend(**options)  # type: ignore[arg-type]
    from ..errors import ConfigError

    raise ConfigError(f"backend {name!r} is not available in this build")
