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


def test_a_compile_waiting_for_the_worker_kills_nothing(make_runtime):
    """A compile queued behind another of the same Runtime (one worker each) had its time
    counted from before it waited: it timed out on the worker's first read and killed the
    worker, under the compile it had waited for. Waiting is bounded apart, and ends in a
    ``CompileTimeout`` that says so, the worker left running."""
    import threading

    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc", compile_timeout_s=0.5)
    assert rt.build(safejit.Source('extern "C" __global__ void k(int* o) { *o = 1; }\n', "k"), arch="sm_90")
    worker = rt._init()[0].backend._worker  # type: ignore[attr-defined]
    proc = worker._proc
    assert proc is not None and proc.poll() is None
    held, done = threading.Event(), threading.Event()

    def busy() -> None:  # (another compile in the worker, as long as it takes)
        with worker._lock:
            held.set()
            done.wait(30)

    threading.Thread(target=busy, daemon=True).start()
    held.wait(30)
    try:
        with pytest.raises(safejit.CompileTimeout, match="busy with other compiles"):
            rt.build(safejit.Source('extern "C" __global__ void k(int* o) { *o = 2; }\n', "k"), arch="sm_90")
    finally:
        done.set()
    assert worker._proc is proc and proc.poll() is None


def test_nvrtc_looking_up_past_the_limit_is_refused_before_the_lookups_are_walked(make_runtime, tmp_path, monkeypatch):
    """The worker's records were sorted and walked whatever their number (400,000 from a
    760 KB source: seconds of this process's time) before the negatives' limit refused the
    build: the distinct paths are counted first, as a preprocessor's are."""
    from safejit.policy import completeness

    monkeypatch.setattr(completeness, "LOOKUPS_FLOOR", 0)  # (the limit: 4 * max_deps = 160)
    root = tmp_path / "root"
    dirs = [root / f"inc{i}" for i in range(4)]
    for d in dirs:
        d.mkdir(parents=True)
    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc", source_roots=(str(root),), max_deps=40)
    if not rt._init()[0].backend.records_lookups():  # type: ignore[attr-defined]
        pytest.skip("NVRTC's lookups are not recorded here")
    probes = "".join(f"#if __has_include(<zz{i:04d}.h>)\n#endif\n" for i in range(80))
    code = probes + 'extern "C" __global__ void k(int* o) { *o = 1; }\n'
    with pytest.raises(safejit.LimitExceededError, match="NVRTC looked up"):
        rt.build(safejit.Source(code, "k"), include_dirs=tuple(map(str, dirs)), arch="sm_90")


def test_a_source_that_writes_missing_headers_into_the_log_adds_a_few(monkeypatch):
    """NVRTC's "cannot open source file" lines were all read as headers to hand over, the
    source's own diagnostic text too: one deprecation message used 4,096 times made 4,096
    of them (65,536 and 7 MB of reply at 4**8). NVRTC stops at its first: a few are read."""
    uses = 6
    src = '[[deprecated("(1): catastrophic error: cannot open source file \\"zz.h\\"")]] __device__ void dep() {}\n'
    src += "#define A0 dep();\n" + "".join(
        f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1}\n" for i in range(1, uses + 1)
    )
    src += f'extern "C" __global__ void k() {{ A{uses} }}\n#error stop\n'
    got = nvrtc.nvrtc_compile_once(nvrtc.NvrtcRequest(src.encode(), "k", ["--gpu-architecture=sm_90"], []))
    assert not got.ok and 0 < len(got.missing) <= 16


def test_an_interrupt_while_a_reply_is_read_leaves_no_reply_for_the_next(make_runtime, monkeypatch):
    """A ``KeyboardInterrupt`` while the host read a reply released the worker with the
    reply still in its pipe: the next request read it as its own, and was handed the
    interrupted compile's cubin. The worker goes with what it was saying."""
    rt = make_runtime(backend="cuda", cuda_compiler="nvrtc")
    real, calls = nvrtc.NvrtcWorker._read, []

    def interrupted(proc: Any, timeout: float, *limit: int) -> dict[str, Any] | None:
        calls.append(1)
        if len(calls) == 2:  # (the hello, then the first compile's reply)
            raise KeyboardInterrupt
        return real(proc, timeout, *limit)

    monkeypatch.setattr(nvrtc.NvrtcWorker, "_read", staticmethod(interrupted))
    kernel = 'extern "C" __global__ void k(char* o) { o[0] = m[threadIdx.x]; }\n'
    first = '__device__ const char m[] = "FIRST11";\n' + kernel
    second = '__device__ const char m[] = "SECOND2";\n' + kernel
    with pytest.raises(KeyboardInterrupt):
        rt.build(safejit.Source(first, "k"), arch="sm_90")
    art = rt.build(safejit.Source(second, "k"), arch="sm_90")
    from pathlib import Path

    cubin = (Path(art.path) / "artifact.cubin").read_bytes()
    assert b"SECOND2" in cubin and b"FIRST11" not in cubin
