"""The stored form of an artifact: a 1-byte codec header, then the bytes, raw or as one
zstd frame. zstd (level 1) is used from ``compress_min_bytes`` up when it makes the
value smaller (cubins shrink 3-5x); small or incompressible values are stored raw.

Decoding never allocates more than its cap: a frame that declares a larger content
size is refused from its header, one that does not declare it is decompressed into
a buffer of at most the cap, and the decoder's window is limited too. A zstd bomb
is a :class:`RemoteError` with reason ``oversize``; undecodable bytes are ``corrupt``.

>>> blob = encode(b"x" * 100_000, min_bytes=65536)
>>> blob[0] == ZSTD and len(blob) < 1000, bytes(decode(blob, max_bytes=1 << 20)) == b"x" * 100_000
(True, True)
"""

from __future__ import annotations

import threading
from typing import Any, Final

from .store import RemoteError

__all__ = ["RAW", "ZSTD", "decode", "decode_parts", "encode", "header"]

RAW: Final = 0x00
ZSTD: Final = 0x01
_NAMES: Final = {RAW: "raw", ZSTD: "zstd"}
#: The largest decoder window accepted: zstd levels up to 19 on default parameters
#: stay within it; a frame asking for more is hostile or from another writer.
MAX_WINDOW: Final = 8 << 20

_local = threading.local()


def header(blob: bytes) -> str:
    """The codec name of a stored value (``raw``, ``zstd``), or ``unknown``."""
    return _NAMES.get(blob[0], "unknown") if blob else "unknown"


def encode(data: bytes, *, min_bytes: int = 64 << 10, level: int = 1) -> bytes:
    """The stored form of ``data``."""
    if len(data) >= min_bytes:
        packed: bytes = _compressor(level).compress(data)
        if len(packed) < len(data):
            return bytes((ZSTD,)) + packed
    return bytes((RAW,)) + data


def decode(blob: bytes, *, max_bytes: int, op: str = "get_blob") -> memoryview:
    """The artifact in a stored value, at most ``max_bytes`` long, as a read-only view: a raw
    value is not copied (a 1 MB copy is a twentieth of a loopback GET of it)."""
    return decode_parts(blob[:1], memoryview(blob)[1:], max_bytes=max_bytes, op=op)


def decode_parts(head: bytes, payload: bytes | memoryview, *, max_bytes: int, op: str = "get_blob") -> memoryview:
    """:func:`decode` of ``head + payload`` (the codec byte and the rest, read apart), not
    joined: a raw payload is the artifact itself, viewed whole (``view.obj`` is it)."""
    if len(head) != 1:
        raise RemoteError("corrupt", op, "empty value" if not head else "a codec header of more than one byte")
    codec = head[0]
    if codec == RAW:
        if len(payload) > max_bytes:
            raise RemoteError("oversize", op, f"{len(payload)} bytes > {max_bytes}")
        return memoryview(payload)
    if codec == ZSTD:
        return memoryview(_unzstd(memoryview(payload), max_bytes, op))
    raise RemoteError("corrupt", op, f"unknown codec byte 0x{codec:02x}")


def _unzstd(payload: memoryview, max_bytes: int, op: str) -> bytes:
    import zstandard

    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise RemoteError("corrupt", op, f"zstd header: {exc}") from None
    if declared > max_bytes:
        raise RemoteError("oversize", op, f"zstd frame declares {declared} bytes > {max_bytes}")
    dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    try:
        # With a declared size this allocates exactly that much (checked above); without
        # one, at most max_bytes. A frame that needs more fails to decompress "fully".
        out = bytes(dctx.decompress(payload, max_output_size=max_bytes, allow_extra_data=False))
    except zstandard.ZstdError as exc:
        raise _classify(dctx, payload, max_bytes, op, exc) from None
    if declared >= 0 and len(out) != declared:
        raise RemoteError("corrupt", op, "zstd frame size differs from its header")
    return out


def _classify(dctx: Any, payload: memoryview, max_bytes: int, op: str, exc: Exception) -> RemoteError:
    """Tell a frame that decompresses past the cap (a bomb) from a damaged one."""
    if "memory" in str(exc).lower():  # the frame asks for a window over MAX_WINDOW
        return RemoteError("oversize", op, "zstd window over the limit")
    try:
        produced = len(dctx.stream_reader(payload).read(max_bytes + 1))
    except Exception:
        produced = 0
    if produced > max_bytes:
        return RemoteError("oversize", op, f"zstd frame decompresses past {max_bytes} bytes")
    return RemoteError("corrupt", op, f"zstd: {exc}")


def _compressor(level: int) -> Any:
    """One compressor per thread and level (a zstd context is not thread-safe)."""
    cache: dict[int, Any] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    found = cache.get(level)
    if found is None:
        import zstandard

        found = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return found
