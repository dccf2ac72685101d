"""A raw ``CUstream`` from what callers pass as a stream: None (torch's current
stream when torch is imported and initialised, else the default stream), an int, an
object with ``__cuda_stream__`` (protocol v0) or a ``cuda_stream``/``handle``/``ptr``
attribute (torch, CuPy, cuda.core and others).

How a type's handle is read is remembered after the first of it, in :data:`READERS`
(shared with the C launch path): an attribute name, or None for the protocol.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final

from ...errors import ConfigError

__all__ = ["READERS", "current_torch_stream", "read_stream", "stream_handle", "torch_stream_functions"]

#: Stream type -> the attribute that holds its handle, or None: call ``__cuda_stream__``.
READERS: dict[type, str | None] = {}
_MAX_READERS: Final = 16


def read_stream(stream: Any, how: str | None) -> int:
    """The handle of ``stream``, read as :data:`READERS` says."""
    if how is None:
        proto = stream.__cuda_stream__
        return int((proto() if callable(proto) else proto)[1])
    return int(getattr(stream, how))


def torch_stream_functions() -> tuple[Callable[[], int], Callable[[int], int]] | None:
    """torch's ``(current device, raw current stream of a device)`` functions once torch
    is imported and its CUDA initialised (for good: it stays so), else None."""
    if _torch_functions:
        return _torch_functions[0]
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    device = getattr(torch._C, "_cuda_getDevice", None)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if device is None or raw is None:
        return None
    _torch_functions.append((device, raw))
    return _torch_functions[0]


_torch_functions: list[tuple[Callable[[], int], Callable[[int], int]]] = []


def current_torch_stream() -> int:
    """torch's current stream on its current device when torch is imported and
    initialised (the raw handle: no Stream object made), else 0."""
    functions = torch_stream_functions()
    if functions is not None:
        device, raw = functions
        return int(raw(device()))
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.current_stream().cuda_stream)


def stream_handle(stream: Any) -> int:
    """The raw handle of ``stream`` (see the module's docstring)."""
    if stream is None:
        return current_torch_stream()
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    kind = type(stream)
    if kind in READERS:
        try:
            return read_stream(stream, READERS[kind])
        except (TypeError, ValueError, AttributeError, IndexError):
            READERS.pop(kind, None)  # not like the first of its type: look again
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        _, raw_handle = proto() if callable(proto) else proto
        handle = int(raw_handle)
        if len(READERS) < _MAX_READERS:
            # Next time: for CuPy's and torch's streams, whose handle attribute is by
            # definition the protocol's handle, that attribute (cheaper than the call).
            same = [a for a in ("ptr", "cuda_stream") if _int_or_none(getattr(stream, a, None)) == handle]
            known = kind.__module__.partition(".")[0] in ("cupy", "torch")
            READERS[kind] = same[0] if same and known else None
        return handle
    for attr in ("cuda_stream", "handle", "ptr"):
        value = getattr(stream, attr, None)
        if value is not None:
            if len(READERS) < _MAX_READERS:  # next time, read just that attribute
                READERS[kind] = attr
            return int(value)
    raise ConfigError(f"cannot use {kind.__name__} as a CUDA stream")


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
