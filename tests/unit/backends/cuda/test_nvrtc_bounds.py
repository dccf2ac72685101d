"""What NVRTC's worker hands back is bounded before it is made: the log (head and tail,
as a compiler process's), and the cubin (one past ``max_artifact_bytes`` is only said to
be, never copied, encoded or sent)."""

from __future__ import annotations

from typing import Any

import pytest

import safejit
from safejit.backends.cuda import nvrtc
from safejit.sandbox._wait import LOG_HEAD, LOG_TAIL
from tests.security._support import assert_nothing_published


@pytest.fixture(autouse=True)
def _nvrtc_here() -> None:
    try:
        nvrtc.library_path()
    except Exception:
        pytest.skip("no NVRTC here")


def _replies(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The worker's replies, as the host read them."""
    got: list[dict[str, Any]] = []
    real = nvrtc.NvrtcWorker._read

    def spy(proc: Any, timeout: float, *limit: int) -> dict[str, Any] | None:
        reply = real(proc, timeout, *limit)
        if reply is not None:
            got.append(reply)
        return reply

    monkeypatch.setattr(nvrtc.NvrtcWorker, "_read", staticmethod(spy))
    return got


#: One truncation warning per template instantiation, with its context: 2**depth of them.
WARNINGS = (
    "template<int N, int L> struct W { static __device__ int f() { signed char c = N * 1000 + 1000; "
    "return c + W<2*N, L-1>::f() + W<2*N+1, L-1>::f(); } };\n"
    "template<int N> struct W<N, 0> { static __device__ int f() { return 0; } };\n"
    'extern "C" __global__ void k(int* o) { *o = W<1, 10>::f(); }\nint the_last_error[-1];\n'
)


def test_a_flood_of_warnings_comes_back_as_its_head_and_tail(make_runtime, monkeypatch):
    """A few hundred bytes of source made a log of hundreds of MB (300 MB at depth 18: 1.4
    GiB in the host), sent whole by the worker and kept whole in the error."""
    replies = _replies(monkeypatch)
    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc")
    with pytest.raises(safejit.CompileError) as info:
        rt.build(safejit.Source(WARNINGS, "k"), arch="sm_90")
    log = info.value.log
    assert "characters cut" in log and len(log) < LOG_HEAD + LOG_TAIL + 200
    assert "the_last_error" in log and "1 error detected" in log[-LOG_TAIL:]  # (the head and the tail kept)
    assert all(len(str(r.get("log", ""))) < LOG_HEAD + LOG_TAIL + 200 for r in replies)


def test_a_cubin_past_the_limit_is_never_sent(make_runtime, cache_dir, monkeypatch):
    """It was copied out of NVRTC, base64-encoded into the reply, read, decoded and its ELF
    parsed before the limit refused it (a 512 MiB one: 2.1 GiB in the host, 72 s)."""
    replies = _replies(monkeypatch)
    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc", max_artifact_bytes=1 << 20)
    code = '__device__ char big[8 << 20] = {1};\nextern "C" __global__ void k(char* o) { *o = big[threadIdx.x]; }\n'
    with pytest.raises(safejit.LimitExceededError, match="the limit is 1048576"):
        rt.build(safejit.Source(code, "k"), arch="sm_90")
    assert replies and all(len(str(r.get("cubin", ""))) < 1 << 20 for r in replies)
    assert any(int(r.get("too_large", 0)) > 8 << 20 for r in replies)
    assert_nothing_published(cache_dir)
    assert rt.build(safejit.Source('extern "C" __global__ void k(char* o) { *o = 1; }\n', "k"), arch="sm_90")
