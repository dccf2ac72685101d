"""In-process NVRTC writes its log and cubin into buffers this library hands it: they
must be its own (bytearrays). ``b" " * 1`` — an empty log's size — is the interpreter's
one shared ``b" "``: NVRTC overwrote it with a NUL, and every ``b" "`` in the process
read ``b"\\x00"`` after (seen as the closure scanner's comments "not removed")."""

from __future__ import annotations

import pytest

from safejit.backends.cuda import nvrtc


def test_an_in_process_compile_with_an_empty_log_leaves_the_shared_bytes_alone():
    try:
        nvrtc.library_path()
    except Exception:
        pytest.skip("no NVRTC here")
    ok = nvrtc.nvrtc_compile_once(nvrtc.NvrtcRequest(b'extern "C" __global__ void k() {}\n', "k", ["-arch=sm_90"], []))
    assert ok.ok and ok.log == "" and ok.cubin[:4] == b"\x7fELF"
    assert all(bytes([i])[0] == i for i in range(256))  # (each one-byte bytes object is shared)
    assert b" " == bytes([32]) and b" ".join([b"a", b"b"]) == b"a b"
