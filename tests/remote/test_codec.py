"""The stored form of an artifact: the codec byte, when zstd is used, and decoding that
never allocates past its cap (real zstd bombs)."""

from __future__ import annotations

import os
import tracemalloc

import pytest
import zstandard

from safejit.cache.remote import RemoteError
from safejit.cache.remote.codec import RAW, ZSTD, decode, encode, header

MiB = 1 << 20


def reason(blob: bytes, max_bytes: int) -> str:
    with pytest.raises(RemoteError) as info:
        decode(blob, max_bytes=max_bytes)
    return info.value.reason


def test_small_value_is_stored_raw():
    blob = encode(b"a" * 1000, min_bytes=64 << 10)
    assert blob == bytes([RAW]) + b"a" * 1000
    assert header(blob) == "raw"
    assert decode(blob, max_bytes=1000) == b"a" * 1000


def test_large_compressible_value_is_stored_zstd():
    data = b"\x7fELF" + bytes(range(256)) * 1000
    blob = encode(data, min_bytes=64 << 10)
    assert blob[0] == ZSTD and header(blob) == "zstd"
    assert len(blob) < len(data) // 10
    assert decode(blob, max_bytes=len(data)) == data


def test_large_incompressible_value_is_stored_raw():
    data = os.urandom(200_000)
    assert encode(data, min_bytes=64 << 10)[0] == RAW


def test_empty_value_round_trips():
    assert decode(encode(b""), max_bytes=0) == b""


def test_raw_value_over_the_cap_is_oversize():
    assert reason(bytes([RAW]) + b"x" * 11, 10) == "oversize"


def test_unknown_codec_byte_is_corrupt():
    assert reason(b"\x07payload", 100) == "corrupt"
    assert header(b"\x07payload") == "unknown"


def test_empty_stored_value_is_corrupt():
    assert reason(b"", 100) == "corrupt"


def test_truncated_zstd_frame_is_corrupt():
    blob = encode(b"abc" * 100_000)
    assert reason(blob[:-7], 1 << 20) == "corrupt"


def test_zstd_frame_with_trailing_bytes_is_corrupt():
    blob = encode(b"abc" * 100_000)
    assert reason(blob + b"junk", 1 << 20) == "corrupt"


def test_garbage_after_the_zstd_byte_is_corrupt():
    assert reason(bytes([ZSTD]) + os.urandom(1000), 1 << 20) == "corrupt"


def _bomb_without_size(total: int) -> bytes:
    """A real zstd frame of ``total`` zero bytes that does not declare its size (streamed)."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(MiB)
    parts = [compressor.compress(chunk) for _ in range(total // MiB)]
    parts.append(compressor.flush())
    return b"".join(parts)


def _peak_while(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_zstd_bomb_without_a_declared_size_is_oversize_without_a_big_allocation():
    frame = _bomb_without_size(1 << 30)  # 1 GiB of zeros in ~33 KB
    assert len(frame) < 64 << 10
    assert zstandard.frame_content_size(frame) == -1
    blob = bytes([ZSTD]) + frame
    peak = _peak_while(lambda: reason(blob, 4 * MiB) == "oversize" or pytest.fail("not oversize"))
    assert peak < 3 * 4 * MiB  # the output buffer is bounded by the cap, never the 1 GiB


def test_zstd_bomb_with_a_declared_size_is_refused_from_its_header():
    frame = zstandard.ZstdCompressor(level=1).compress(bytes(64 * MiB))
    assert zstandard.frame_content_size(frame) == 64 * MiB
    blob = bytes([ZSTD]) + frame
    peak = _peak_while(lambda: reason(blob, MiB) == "oversize" or pytest.fail("not oversize"))
    assert peak < MiB


def _frame(declared: int, payload: bytes) -> bytes:
    """A zstd frame by hand: magic, a descriptor with an 8-byte content size, a 1 MiB window,
    ``declared`` as the content size, and ``payload`` as one raw last block."""
    magic = bytes([0x28, 0xB5, 0x2F, 0xFD])
    descriptor, window = 0xC0, (20 - 10) << 3
    block = (1 | len(payload) << 3).to_bytes(3, "little") + payload
    return magic + bytes([descriptor, window]) + declared.to_bytes(8, "little") + block


def test_hand_made_frame_decodes_when_honest():
    assert decode(bytes([ZSTD]) + _frame(4, b"tiny"), max_bytes=4) == b"tiny"


def test_zstd_frame_lying_about_a_huge_size_is_oversize():
    frame = _frame(1 << 40, b"tiny")
    assert zstandard.frame_content_size(frame) == 1 << 40
    assert reason(bytes([ZSTD]) + frame, 4 * MiB) == "oversize"


def test_zstd_frame_declaring_less_than_it_holds_is_corrupt():
    assert reason(bytes([ZSTD]) + _frame(2, b"tiny"), 4 * MiB) == "corrupt"


def test_zstd_frame_asking_for_a_huge_window_is_refused():
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=27)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = compressor.compress(os.urandom(1 << 16) * 4) + compressor.flush()
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 27
    blob = bytes([ZSTD]) + frame
    assert reason(blob, 512 * MiB) == "oversize"
