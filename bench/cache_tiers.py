"""Cache-tier benchmarks, each printed against a peer measured in the same run.

    python bench/cache_tiers.py --json bench-out.json [--quick] [--only cute ...]

Keys written (targets in parentheses):
  host_memory_hit_p50_us          safejit memory hit, p50 of batch means (<= 2 us)
  host_memory_hit_vs_lru_cache    ... divided by a functools.lru_cache hit on the same arguments
  host_call_checked_us            a checked host call add(2, 3), p50 of batch means
  host_call_raw_ctypes_us         the same function through plain ctypes (argtypes/restype set), same run
  host_call_overhead_us           checked minus raw, paired by batch (<= 0.5 us)
  host_call_vs_raw_ctypes         checked / raw, paired by batch
  host_array_call_checked_us      a checked call total(x, 16) with a float64 array (dtype, layout checked)
  host_array_call_vs_raw_ctypes   ... / plain ctypes passing x.ctypes.data (what a ctypes user writes; <= 1.0)
  host_array_call_vs_ndpointer    ... / ctypes with numpy.ctypeslib.ndpointer argtypes (NumPy's checked call)
  host_disk_hit_ms                fresh process, compile call -> callable kernel, one header (<= 1 ms)
  host_disk_hit_1000_headers_ms   same with 1,000 generated headers, ~10 MB (<= 10 ms)
  *_first_ms                      the first such process, which rehashes every file (no stat memo yet)
  *_next_ms                       the same processes' second kernel (another leaf, the same headers): the
                                  hit without the process's one-time set-up (state dir, toolchain, roots)
  host_cold_overhead_ratio        cold compile through safejit / the bare compiler subprocess (<= 1.10);
                                  paired: the median of each compile's ratio to the peer's right after it
  procs16_compiles                16 processes cold-starting one spec: compiler runs in total (1)
  telemetry_memory_hit_overhead_us  memory hit with the OpenTelemetry SDK installed minus without (<= 0.5 us)
  telemetry_cold_overhead_ratio     cold compile with the SDK / without (<= 1.02), paired by round
  verify_gb_per_s                 full rehash of a large closure (no stat memo), against a plain read
  prune_leaves_per_s              safejit prune over 100,000 leaves
  cuda_memory_hit_vs_peer         CUDA memory hit / cuda.core make_program_cache_key + InMemoryProgramCache (<= 0.2)
  cuda_disk_hit_vs_peer           fresh-process verified disk hit / FileStreamProgramCache hit (<= 3.0)
  cuda_cold_vs_peer               cold NVRTC compile through safejit / cuda.core Program.compile into its
                                  persistent FileStreamProgramCache (<= 1.10), paired
  cuda_cold_vs_memory_only_peer   ... / the same compile into InMemoryProgramCache (kept nothing on disk)
  cute_nvrtc_cold_vs_bare         a CuTe SGEMM (tests/data/cute_sgemm.cu, nvidia-cutlass headers), cold, through
                                  safejit's NVRTC (its worker up) / bare NVRTC in this process with the same
                                  options and search path (<= 1.10), paired; each round a new PTX, and the
                                  peer's log must show that ptxas ran (not the driver's ComputeCache)
  cute_nvcc_cold_vs_bare          ... through safejit's nvcc / bare `nvcc -cubin -arch=sm_90 -I...` (<= 1.10), paired
  cute_*_cold_cpu_vs_bare         the same pairs in CPU seconds (all processes'): steadier on a loaded machine
  cute_closure_files              files in the NVRTC leaf's closure (and cute_negatives: paths that must stay absent)
  cute_disk_hit_ms                fresh process, verified NVRTC disk hit of the CuTe SGEMM
  cute_disk_hit_vs_cuda_core      ... / cuda.core FileStreamProgramCache hit of the same cubin (<= 2.0; its key
                                  covers no header: a constant extra_digest, as a cuda.core user would write)

The cold ratios are paired: each compile through safejit is divided by the peer's
compile that follows it, and the median of those ratios is the result. Compile
times on a shared machine drift by 10-20% within a run; a pair sees the same
conditions. The ratio of the two medians is printed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import safejit
import safejit.backends.host
from safejit.cache import staging as spares

ONE_HEADER_C = '#include "one.h"\nint add(int a, int b) { return a + b + ONE; }\n'

DISK_CHILD = r"""
import json, sys, time
import safejit, safejit.backends.host
cache, root, code, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,), source_roots=(root,)))
src = safejit.Source(code, "add")
t0 = time.perf_counter()
k = rt.compile(src, include_dirs=(root + "/include",)).kernel("add")
t1 = time.perf_counter()
assert k(1, 2) == 3 + n, k(1, 2)
nxt = None
if len(sys.argv) > 5:  # another kernel, after the first: what a process pays per kernel past its set-up
    t2 = time.perf_counter()
    k2 = rt.compile(safejit.Source(sys.argv[5], "add"), include_dirs=(root + "/include",)).kernel("add")
    nxt = time.perf_counter() - t2
    assert k2(1, 2) == 3 + n, k2(1, 2)
stats = rt.stats()
tier = "disk" if stats["disk_hits"] == (1 if nxt is None else 2) else "other"
print(json.dumps({"seconds": t1 - t0, "next": nxt, "compiles": stats["compiles"], "tier": tier}))
"""

PROCS_CHILD = r"""
import json, os, sys, time
import safejit
go, cache = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.001)
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
k = rt.compile(safejit.Source("int twice(int x) { return 2 * x; }", "twice")).kernel("twice")
assert k(21) == 42
print(json.dumps(rt.stats()["compiles"]))
"""


def memory_hit(results: dict[str, Any], quick: bool) -> None:
    with tempfile.TemporaryDirectory() as cache:
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
        src = safejit.Source("int add(int a, int b) { return a + b; }", "add")
        rt.compile(src)
        batches, per = (30, 1000) if quick else (200, 2000)

        @functools.lru_cache(maxsize=1024)
        def peer(source: safejit.Source, include_dirs: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> int:
            return 1

        def timed(fn: Any) -> float:
            means = []
            for _ in range(batches):
                t0 = time.perf_counter_ns()
                for _ in range(per):
                    fn(src)
                means.append((time.perf_counter_ns() - t0) / per / 1000)
            return statistics.median(means)

        ours = timed(rt.compile)
        theirs = timed(peer)
        rt.close()
    results["host_memory_hit_p50_us"] = round(ours, 3)
    results["host_memory_hit_vs_lru_cache"] = round(ours / theirs, 2)
    print(f"memory hit p50          {ours:8.3f} us   (lru_cache peer {theirs:.3f} us; ratio {ours / theirs:.1f})")


CALLS_C = r"""
#include <stddef.h>
int add(int a, int b) { return a + b; }
double total(const double *x, size_t n) { double s = 0; for (size_t i = 0; i < n; i++) s += x[i]; return s; }
"""


def host_calls(results: dict[str, Any], quick: bool) -> None:
    """A checked host call against the same function through plain ctypes (argtypes and
    restype set; for an array, the address a ctypes user passes, ``x.ctypes.data``, and
    NumPy's own checked ``ndpointer``), batch by batch in the same run."""
    import ctypes

    with tempfile.TemporaryDirectory() as cache:
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
        art = rt.build(safejit.Source(CALLS_C, "calls"))
        mod = rt.compile(safejit.Source(CALLS_C, "calls"))
        lib = ctypes.CDLL(str(Path(art.path) / "artifact.so"))  # (the same bytes, loaded by ctypes itself)
        raw_add = lib.add
        raw_add.argtypes, raw_add.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        checked_add = mod.kernel("add")
        batches, per = (30, 2000) if quick else (200, 5000)

        def interleaved(**fns: tuple[Any, ...]) -> dict[str, list[float]]:
            got: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(batches):
                for name, (fn, *args) in fns.items():
                    t0 = time.perf_counter_ns()
                    for _ in range(per // 10):
                        fn(*args)
                    got[name].append((time.perf_counter_ns() - t0) / (per // 10) / 1000)
            return got

        scalar = interleaved(checked=(checked_add, 2, 3), raw=(raw_add, 2, 3))
        ours, peer = statistics.median(scalar["checked"]), statistics.median(scalar["raw"])
        results["host_call_checked_us"] = round(ours, 3)
        results["host_call_raw_ctypes_us"] = round(peer, 3)
        extra = statistics.median(a - b for a, b in zip(scalar["checked"], scalar["raw"], strict=True))
        results["host_call_overhead_us"] = round(extra, 3)
        results["host_call_vs_raw_ctypes"] = round(paired_ratio(scalar["checked"], scalar["raw"]), 3)
        print(
            f"host call add(2, 3)     {ours:8.3f} us   (raw ctypes with argtypes {peer:.3f} us; "
            f"+{results['host_call_overhead_us']:.3f} us, {results['host_call_vs_raw_ctypes']:.2f} x paired)"
        )
        try:
            import numpy as np
        except ImportError:
            rt.close()
            return
        x = np.arange(16.0)
        raw_total = lib.total
        raw_total.argtypes, raw_total.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_double
        nd_total = ctypes.CDLL(str(Path(art.path) / "artifact.so")).total
        nd_total.argtypes = [np.ctypeslib.ndpointer(np.float64, flags="C_CONTIGUOUS"), ctypes.c_size_t]
        nd_total.restype = ctypes.c_double
        checked_total = mod.kernel("total")
        array = interleaved(
            checked=(checked_total, x, 16),
            raw=(lambda a, n: raw_total(a.ctypes.data, n), x, 16),
            ndpointer=(nd_total, x, 16),
        )
        ours = statistics.median(array["checked"])
        results["host_array_call_checked_us"] = round(ours, 3)
        results["host_array_call_vs_raw_ctypes"] = round(paired_ratio(array["checked"], array["raw"]), 3)
        results["host_array_call_vs_ndpointer"] = round(paired_ratio(array["checked"], array["ndpointer"]), 3)
        print(
            f"host call total(x, 16)  {ours:8.3f} us   (raw ctypes with x.ctypes.data "
            f"{statistics.median(array['raw']):.3f} us, {results['host_array_call_vs_raw_ctypes']:.2f} x; "
            f"numpy ndpointer {statistics.median(array['ndpointer']):.3f} us, "
            f"{results['host_array_call_vs_ndpointer']:.2f} x; paired)"
        )
        rt.close()


def _make_root(base: Path, headers: int) -> tuple[Path, str]:
    root = base / "src"
    inc = root / "include"
    inc.mkdir(parents=True)
    if headers == 1:
        (inc / "one.h").write_text("#define ONE 0\n")
        return root, ONE_HEADER_C
    filler = "/* " + "x" * 9_900 + " */\n"
    lines = []
    for i in range(headers):
        (inc / f"h{i:04d}.h").write_text(f"#ifndef H{i}\n#define H{i}\n{filler}#endif\n")
        lines.append(f'#include "h{i:04d}.h"')
    (inc / "one.h").write_text("#define ONE 0\n")
    return root, "\n".join(lines) + "\n" + ONE_HEADER_C


def disk_hit(results: dict[str, Any], key: str, headers: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as base:
        root, code = _make_root(Path(base), headers)
        # Headers written this instant are "racily clean" and always rehashed;
        # real headers are older than the 2 s window. Let these age past it.
        time.sleep(2.1)
        cache = str(Path(base) / "cache")
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,), source_roots=(str(root),)))
        second = code + "/* the process's second kernel: another leaf */\n"
        for each in (code, second):
            rt.build(safejit.Source(each, "add"), include_dirs=(str(root / "include"),))
        rt.close()
        times, nexts = [], []
        for _ in range(runs + 1):
            out = subprocess.run(
                [sys.executable, "-c", DISK_CHILD, cache, str(root), code, "0", second],
                capture_output=True,
                text=True,
                check=True,
            )
            report = json.loads(out.stdout)
            assert report["compiles"] == 0 and report["tier"] == "disk", report
            times.append(report["seconds"] * 1e3)
            nexts.append(report["next"] * 1e3)
        # Peer: the same process start reading the artifact and headers without verifying.
        size = sum(f.stat().st_size for f in (root / "include").iterdir())
    # The first process rehashes everything (and records the stat memo); the rest may trust it.
    first, ms = times[0], statistics.median(times[1:])
    nxt = statistics.median(nexts[1:])
    results[key] = round(ms, 3)
    results[key.replace("_ms", "_first_ms")] = round(first, 3)
    results[key.replace("_ms", "_next_ms")] = round(nxt, 3)
    print(
        f"{key:30s} {ms:8.3f} ms   ({headers} header(s), {size / 1e6:.1f} MB, median of {runs} fresh processes;"
        f" the first, which rehashes all: {first:.3f} ms; the same process's next kernel: {nxt:.3f} ms)"
    )


def quiesce() -> None:
    """Let the disk settle before a cold measurement (untimed): what earlier sections
    wrote and deleted (the 1000-header trees) is still being written back and
    discarded, which would slow every fsync in the section after (safejit's, not the
    bare peer's, which makes none)."""
    spares.settle()
    os.sync()
    time.sleep(1.0)


def paired_ratio(ours: list[float], peer: list[float]) -> float:
    """The median of ``ours[i] / peer[i]``: each measurement against the peer's next to it."""
    return statistics.median(o / p for o, p in zip(ours, peer, strict=True))


def cold_overhead(results: dict[str, Any], runs: int) -> None:
    quiesce()
    cc = os.path.realpath(shutil.which("cc", path="/usr/local/bin:/usr/bin:/bin") or "cc")
    with tempfile.TemporaryDirectory() as base:
        cache = str(Path(base) / "cache")
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
        rt.compile(safejit.Source("int warm(void) { return 0; }", "warm"))  # shim, probe: once per process
        ours, bare = [], []
        work = Path(base) / "bare"
        work.mkdir()
        for i in range(runs):
            code = f"#include <stdint.h>\nint64_t f{i}(int64_t x) {{ return x * {i + 3}; }}\n"
            t0 = time.perf_counter()
            rt.compile(safejit.Source(code, "f"))
            ours.append(time.perf_counter() - t0)
            spares.settle()  # our background work must not slow the bare compiler down (untimed)
            src = work / f"b{i}.c"
            src.write_text(code + "/* bare */\n")
            t0 = time.perf_counter()
            subprocess.run(
                [
                    cc,
                    "-shared",
                    "-fPIC",
                    "-O2",
                    "-MD",
                    "-MF",
                    str(work / f"b{i}.d"),
                    "-o",
                    str(work / f"b{i}.so"),
                    "-x",
                    "c",
                    str(src),
                ],
                check=True,
                stdin=subprocess.DEVNULL,
            )
            bare.append(time.perf_counter() - t0)
        assert rt.stats()["compiles"] == runs + 1
        rt.close()
    ratio = paired_ratio(ours, bare)
    results["host_cold_overhead_ratio"] = round(ratio, 3)
    print(
        f"cold compile            {statistics.median(ours) * 1e3:8.2f} ms   (bare compiler "
        f"{statistics.median(bare) * 1e3:.2f} ms; ratio {ratio:.3f} paired, "
        f"{statistics.median(ours) / statistics.median(bare):.3f} of medians)"
    )


def procs16(results: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as base:
        go = Path(base) / "go"
        cache = str(Path(base) / "cache")
        procs = [
            subprocess.Popen([sys.executable, "-c", PROCS_CHILD, str(go), cache], stdout=subprocess.PIPE, text=True)
            for _ in range(16)
        ]
        time.sleep(1.0)
        go.touch()
        total = sum(json.loads(p.communicate(timeout=300)[0]) for p in procs)
    results["procs16_compiles"] = total
    print(f"16 processes, one spec  {total:8d} compile(s)")


TELEMETRY_CHILD = r"""
import json, statistics, sys, tempfile, time
import safejit, safejit.backends.host
from safejit.cache import staging as spares
if sys.argv[1] == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
runs = int(sys.argv[2])
with tempfile.TemporaryDirectory() as cache:
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
    src = safejit.Source("int add(int a, int b) { return a + b; }", "add")
    rt.compile(src)
    means = []
    for _ in range(50):
        t0 = time.perf_counter_ns()
        for _ in range(2000):
            rt.compile(src)
        means.append((time.perf_counter_ns() - t0) / 2000 / 1000)
    cold = []
    for i in range(runs):
        code = "int f(int x) { return x * %d; }" % (i + sys.argv[3].__hash__() % 1000 * 1000 + 7)
        t0 = time.perf_counter()
        rt.compile(safejit.Source(code, "f"))
        cold.append(time.perf_counter() - t0)
        spares.settle()  # (the background work of one compile must not slow the next)
print(json.dumps({"hit_us": statistics.median(means), "cold_s": cold}))
"""


def telemetry(results: dict[str, Any], rounds: int, quick: bool = False) -> None:
    """The SDK can be installed once per process: each round runs a process with it and
    one without, side by side (in alternating order); the cold ratio is the median of the
    rounds' ratios of medians, as the other cold ratios are paired."""
    quiesce()
    hits: dict[str, list[float]] = {"sdk": [], "nosdk": []}
    cold: dict[str, list[float]] = {"sdk": [], "nosdk": []}
    paired = []
    for r in range(rounds):
        medians = {}
        for mode in ("nosdk", "sdk") if r % 2 == 0 else ("sdk", "nosdk"):
            out = subprocess.run(
                [sys.executable, "-c", TELEMETRY_CHILD, mode, "5" if quick else "25", f"{mode}{r}"],
                capture_output=True,
                text=True,
                check=True,
            )
            report = json.loads(out.stdout)
            hits[mode].append(report["hit_us"])
            cold[mode] += report["cold_s"]
            medians[mode] = statistics.median(report["cold_s"])
        paired.append(medians["sdk"] / medians["nosdk"])
    overhead = statistics.median(hits["sdk"]) - statistics.median(hits["nosdk"])
    ratio = statistics.median(paired)
    results["telemetry_memory_hit_overhead_us"] = round(overhead, 3)
    results["telemetry_cold_overhead_ratio"] = round(ratio, 3)
    print(
        f"telemetry, memory hit   {overhead:+8.3f} us   (SDK on {statistics.median(hits['sdk']):.3f} us vs off "
        f"{statistics.median(hits['nosdk']):.3f} us)"
    )
    print(
        f"telemetry, cold compile {ratio:8.3f} x    (SDK on {statistics.median(cold['sdk']) * 1e3:.2f} ms vs off "
        f"{statistics.median(cold['nosdk']) * 1e3:.2f} ms; paired by round, "
        f"{statistics.median(cold['sdk']) / statistics.median(cold['nosdk']):.3f} of medians)"
    )


def verify_throughput(results: dict[str, Any], quick: bool) -> None:
    """Full rehash of a large closure (no stat memo): bytes verified per second."""
    count, size = (64, 1 << 20) if quick else (256, 1 << 20)
    with tempfile.TemporaryDirectory() as base:
        root = Path(base) / "src"
        inc = root / "include"
        inc.mkdir(parents=True)
        chunk = os.urandom(size // 4) * 4
        for i in range(count):
            (inc / f"big{i:03d}.h").write_bytes(b"/*" + chunk[: size - 5].replace(b"*/", b"xx") + b"*/\n")
        code = "".join(f'#include "big{i:03d}.h"\n' for i in range(count)) + "int one(void) { return 1; }\n"
        cache = str(Path(base) / "cache")
        cfg = safejit.Config(cache_dirs=(cache,), source_roots=(str(root),), trust_stat=False)
        rt = safejit.Runtime(config=cfg)
        rt.build(safejit.Source(code, "one"), include_dirs=(str(inc),))
        rt.close()
        times = []
        checker = safejit.Runtime(config=cfg)  # trust_stat=False: every explain rehashes everything
        for _ in range(3 if quick else 7):
            t0 = time.perf_counter()
            explanation = checker.explain(safejit.Source(code, "one"), include_dirs=(str(inc),))
            times.append(time.perf_counter() - t0)
            assert explanation.result == "hit", explanation
        checker.close()
        total = count * size
        # Peer: reading the same files without hashing them.
        t0 = time.perf_counter()
        for f in inc.iterdir():
            f.read_bytes()
        read_s = time.perf_counter() - t0
    best = statistics.median(times)
    results["verify_gb_per_s"] = round(total / best / 1e9, 3)
    print(
        f"verify (full rehash)    {total / best / 1e9:8.3f} GB/s (closure {total / 1e6:.0f} MB in {best * 1e3:.1f} ms;"
        f" plain read {total / read_s / 1e9:.2f} GB/s)"
    )


def prune_throughput(results: dict[str, Any], quick: bool) -> None:
    """``prune`` over many leaves (laid out directly on tmpfs when there is one)."""
    from safejit.cache import maintenance
    from safejit.cache.layout import CacheLayout

    n = 10_000 if quick else 100_000
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm) as cache:
        layout = CacheLayout(cache)
        (Path(cache) / "v1" / "tmp").mkdir(parents=True)
        for i in range(n):
            key = f"{i:064x}"
            leaf = Path(layout.leaf("default", "host", key, key))
            leaf.mkdir(parents=True)
            for name in ("artifact.so", "manifest.json", ".committed"):
                (leaf / name).write_bytes(b"x")
        t0 = time.perf_counter()
        report = maintenance.prune(cache, max_bytes=0, grace_s=0)
        elapsed = time.perf_counter() - t0
        assert report.removed == n, report
    results["prune_leaves_per_s"] = round(n / elapsed)
    print(
        f"prune                   {n / elapsed:8.0f} leaves/s ({n} leaves on {'tmpfs' if shm else 'disk'}, "
        f"{elapsed:.2f} s)"
    )


CUDA_CODE = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }'

CUDA_DISK_CHILD = r"""
import json, sys, time
mode, cache, code = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    from cuda.bindings import driver
    gpu = driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
except Exception:  # no driver: the cubin, not loaded, on both sides
    gpu = False
if gpu:
    _, dev = driver.cuDeviceGet(0)
    _, ctx = driver.cuDevicePrimaryCtxRetain(dev); driver.cuCtxSetCurrent(ctx)  # the context, before timing
if mode == "safejit":
    import safejit, safejit.backends.cuda.backend  # the libraries imported before timing, as the peer's are
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,)))
    t0 = time.perf_counter()
    mod = rt.compile(safejit.Source(code, "scale"), arch="sm_90")
    if gpu:
        mod.kernel("scale")
    t1 = time.perf_counter()
    assert rt.stats()["disk_hits"] == 1 and rt.stats()["compiles"] == 0
else:
    from cuda.core import ObjectCode, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    cache_ = FileStreamProgramCache(cache)
    t0 = time.perf_counter()
    key = make_program_cache_key(code=code, code_type="c++", options=ProgramOptions(arch="sm_90"), target_type="cubin")
    cubin = cache_.get(key)
    assert cubin is not None
    if gpu:
        ObjectCode.from_cubin(cubin).get_kernel("scale")
    t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
"""


def cuda_tiers(results: dict[str, Any], quick: bool) -> None:
    """safejit's CUDA tiers against cuda.core's own program cache (NVRTC, header-free kernel)."""
    try:
        from cuda.core import Program, ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache, make_program_cache_key
    except ImportError:
        print("cuda tiers              skipped (cuda-core not installed)")
        return
    opts = ProgramOptions(arch="sm_90")
    with tempfile.TemporaryDirectory() as base:
        rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(f"{base}/ours",)))
        src = safejit.Source(CUDA_CODE, "scale")
        rt.compile(src, arch="sm_90")
        mem = InMemoryProgramCache()
        Program(CUDA_CODE, "c++", options=opts).compile("cubin", cache=mem)

        def peer_hit() -> None:
            key = make_program_cache_key(code=CUDA_CODE, code_type="c++", options=opts, target_type="cubin")
            assert mem.get(key) is not None

        n = 200 if quick else 2000
        ours_t, peer_t = [], []
        for _ in range(5 if quick else 15):
            t0 = time.perf_counter()
            for _ in range(n):
                rt.compile(src, arch="sm_90")
            ours_t.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                peer_hit()
            peer_t.append((time.perf_counter() - t0) / n)
        mem_ratio = statistics.median(ours_t) / statistics.median(peer_t)
        # Cold: fresh sources each time, alternating (many pairs: this machine's speed
        # drifts). Our background work (deleting the work dir, refilling the prepared ones,
        # the build dir's fsync) is let finish, untimed, before the peer's turn: it must
        # not slow the peer down.
        # The constants are new in every run: NVRTC may keep its own cache of compiled code
        # (the driver's ComputeCache, ~/.nv), which a repeated source would hit.
        # Two peers: cuda.core's persistent cache (its entry written and fsynced, as
        # safejit's leaf is: the like-for-like one, the key's), and its memory-only one
        # (the compile and nothing kept past the process). Their order alternates.
        quiesce()
        cold_ours: list[float] = []
        cold_peer: dict[str, list[float]] = {"file": [], "memory": []}
        peers = {"file": FileStreamProgramCache(f"{base}/peer-cold"), "memory": InMemoryProgramCache()}
        salt = random.SystemRandom().randrange(1 << 20)
        for i in range(3 if quick else 25):
            t0 = time.perf_counter()
            rt.compile(safejit.Source(CUDA_CODE.replace("*= a", f"*= a + {salt + i}.0f"), "scale"), arch="sm_90")
            cold_ours.append(time.perf_counter() - t0)
            spares.settle()
            for j, kind in enumerate(("file", "memory") if i % 2 else ("memory", "file")):
                code = CUDA_CODE.replace("*= a", f"*= a - {salt + i + 0.5 * j}f")
                t0 = time.perf_counter()
                Program(code, "c++", options=opts).compile("cubin", cache=peers[kind])
                cold_peer[kind].append(time.perf_counter() - t0)
        cold_ratio = paired_ratio(cold_ours, cold_peer["file"])
        cold_ratio_memory = paired_ratio(cold_ours, cold_peer["memory"])
        rt.close()
        Program(CUDA_CODE, "c++", options=opts).compile("cubin", cache=FileStreamProgramCache(f"{base}/peer"))
        disk = {"safejit": [], "peer": []}
        for _ in range(3 if quick else 9):
            for mode, cache in (("safejit", f"{base}/ours"), ("peer", f"{base}/peer")):
                out = subprocess.run(
                    [sys.executable, "-c", CUDA_DISK_CHILD, mode, cache, CUDA_CODE],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                disk[mode].append(json.loads(out.stdout)["seconds"])
        disk_ratio = statistics.median(disk["safejit"]) / statistics.median(disk["peer"])
    results["cuda_memory_hit_vs_peer"] = round(mem_ratio, 3)
    results["cuda_disk_hit_vs_peer"] = round(disk_ratio, 3)
    results["cuda_cold_vs_peer"] = round(cold_ratio, 3)
    results["cuda_cold_vs_memory_only_peer"] = round(cold_ratio_memory, 3)
    print(
        f"cuda memory hit         {mem_ratio:8.3f} x    ({statistics.median(ours_t) * 1e6:.2f} us vs cuda.core "
        f"key+InMemoryProgramCache {statistics.median(peer_t) * 1e6:.2f} us)"
    )
    print(
        f"cuda disk hit (fresh)   {disk_ratio:8.3f} x    ({statistics.median(disk['safejit']) * 1e3:.2f} ms verified "
        f"vs FileStreamProgramCache {statistics.median(disk['peer']) * 1e3:.2f} ms)"
    )
    for label, ratio, kind in (
        ("cuda cold compile      ", cold_ratio, "file"),
        ("  vs memory-only peer  ", cold_ratio_memory, "memory"),
    ):
        peer = "FileStreamProgramCache" if kind == "file" else "InMemoryProgramCache"
        print(
            f"{label} {ratio:8.3f} x    ({statistics.median(cold_ours) * 1e3:.1f} ms vs cuda.core Program.compile "
            f"into {peer} {statistics.median(cold_peer[kind]) * 1e3:.1f} ms; paired, "
            f"{statistics.median(cold_ours) / statistics.median(cold_peer[kind]):.3f} of medians)"
        )


CUTE_SOURCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "cute_sgemm.cu"

CUTE_DISK_CHILD = r"""
import json, sys, time
mode, cache, inc, code = sys.argv[1:5]
if mode == "safejit":
    import safejit, safejit.backends.cuda.backend  # (imported before timing, as cuda.core is)
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(inc,)))
    t0 = time.perf_counter()
    rt.compile(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), arch="sm_90", flags=("-std=c++17",))
    t1 = time.perf_counter()
    assert rt.stats()["disk_hits"] == 1 and rt.stats()["compiles"] == 0, rt.stats()
else:
    from cuda.core import ProgramOptions
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    peer = FileStreamProgramCache(cache)
    t0 = time.perf_counter()
    opts = ProgramOptions(arch="sm_90", std="c++17", include_path=[inc])
    key = make_program_cache_key(code=code, code_type="c++", options=opts, target_type="cubin", extra_digest=b"cute")
    hit = peer.get(key)
    t1 = time.perf_counter()
    assert hit is not None
print(json.dumps({"seconds": t1 - t0}))
"""


def _cutlass_include() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "source" / "include"
    return str(found.resolve()) if (found / "cute" / "tensor.hpp").is_file() else None


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds so far of this process (all threads), its reaped children, and ``pids``."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _workers() -> list[int]:
    """This process's NVRTC workers (persistent children, never reaped while they serve)."""
    me, found = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1] == me and (
                    b"safejit.backends.cuda.worker" in Path(f"/proc/{entry}/cmdline").read_bytes()
                ):
                    found.append(int(entry))
    return found


def cute(results: dict[str, Any], quick: bool) -> None:
    """A header-heavy kernel: the CuTe SGEMM, cold through NVRTC and nvcc against the bare
    compilers, its closure, and a fresh process's verified hit against cuda.core's."""
    inc = _cutlass_include()
    nvcc = shutil.which("nvcc", path=f"/usr/local/cuda/bin:{os.environ.get('PATH', '')}")
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        nvrtc = None
    if inc is None or nvrtc is None:
        print("cute                    skipped (needs nvidia-cutlass and cuda-bindings)")
        return
    from safejit.backends.cuda.backend import CudaBackend

    kernel = CUTE_SOURCE.read_text()
    rounds = 2 if quick else 7
    salt = random.SystemRandom().randrange(1 << 30)
    search = [inc, *CudaBackend()._include_dir()]
    bare_opts = [o.encode() for o in ("--gpu-architecture=sm_90", "-default-device", "--ptxas-options=-v")]
    bare_opts += [b"-std=c++17", *(f"-I{d}".encode() for d in search)]

    def bare_nvrtc(code: str) -> bytes:
        """Compile ``code``; its log (ptxas's ``-v`` lines when ptxas ran)."""
        _, prog = nvrtc.nvrtcCreateProgram(code.encode(), b"cute_sgemm.cu", 0, [], [])
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(bare_opts), bare_opts)
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            cubin = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, cubin)
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log: bytes = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            return log
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    quiesce()
    with tempfile.TemporaryDirectory() as base:
        sections = [("nvrtc", "nvrtc")] + ([("nvcc", "nvcc")] if nvcc else [])
        for label, compiler in sections:
            cfg = safejit.Config(
                backend="cuda", cuda_compiler=compiler, cache_dirs=(f"{base}/{label}",), source_roots=(inc,)
            )
            rt = safejit.Runtime(config=cfg)
            rt.build(safejit.Source('extern "C" __global__ void k() {}', "k"), arch="sm_90")  # worker, probe, shim
            if compiler == "nvrtc":
                bare_nvrtc('extern "C" __global__ void k() {}')  # NVRTC loaded here too
            wall: dict[str, list[float]] = {"ours": [], "bare": []}
            cpu: dict[str, list[float]] = {"ours": [], "bare": []}
            for i in range(rounds):
                # A new source each round whose PTX is new too (a comment would leave it alike):
                # in a process with the CUDA driver up, NVRTC 13 takes the cubin of a PTX it
                # compiled before from the driver's ComputeCache (~/.nv) and ptxas does not
                # run, which safejit's worker (denied the driver and that cache) never does.
                code = f"{kernel}\n__device__ int cute_bench_salt = {salt + i};\n"
                for who in ("ours", "bare") if i % 2 == 0 else ("bare", "ours"):
                    spares.settle()  # (one side's background work must not slow the other)
                    pids = _workers()
                    c0, t0 = _cpu_of(pids), time.perf_counter()
                    if who == "ours":
                        art = rt.build(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), arch="sm_90",
                                       flags=("-std=c++17",))  # fmt: skip
                        assert art.source == "compiled", art
                    elif compiler == "nvrtc":
                        log = bare_nvrtc(code)
                        assert b"Compiling entry function" in log, f"ptxas did not run (a cached cubin?): {log!r}"
                    else:
                        work = Path(base) / "bare"
                        work.mkdir(exist_ok=True)
                        (work / "k.cu").write_text(code)
                        subprocess.run([nvcc, "-cubin", "-arch=sm_90", f"-I{inc}", "-o", str(work / "k.cubin"),
                                        str(work / "k.cu")], check=True, cwd=work)  # fmt: skip
                    wall[who].append(time.perf_counter() - t0)
                    cpu[who].append(_cpu_of(pids) - c0)
            if compiler == "nvrtc":
                manifest = json.loads((Path(art.path) / "manifest.json").read_text())
                results["cute_closure_files"] = len(manifest["deps"])
                results["cute_negatives"] = len(manifest["negatives"])
            rt.close()
            ratio, cpu_ratio = paired_ratio(wall["ours"], wall["bare"]), paired_ratio(cpu["ours"], cpu["bare"])
            results[f"cute_{label}_cold_vs_bare"] = round(ratio, 3)
            results[f"cute_{label}_cold_cpu_vs_bare"] = round(cpu_ratio, 3)
            print(
                f"cute {label:5s} cold        {ratio:8.3f} x    ({statistics.median(wall['ours']):.2f} s vs bare "
                f"{statistics.median(wall['bare']):.2f} s, paired; CPU {cpu_ratio:.3f} x: "
                f"{statistics.median(cpu['ours']):.2f} vs {statistics.median(cpu['bare']):.2f} s)"
            )
        print(
            f"cute closure            {results['cute_closure_files']:8d} files, {results['cute_negatives']} paths "
            "that must stay absent"
        )
        cute_disk_hit(results, base, inc, kernel, 3 if quick else 9)


def cute_disk_hit(results: dict[str, Any], base: str, inc: str, kernel: str, runs: int) -> None:
    """A fresh process's verified hit of the CuTe SGEMM against cuda.core's unverified one."""
    try:
        from cuda.core import ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    except ImportError:
        print("cute disk hit           skipped (cuda-core not installed)")
        return
    ours = f"{base}/hit"
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(ours,), source_roots=(inc,)))
    art = rt.build(safejit.Source(kernel, "cute_sgemm"), include_dirs=(inc,), arch="sm_90", flags=("-std=c++17",))
    rt.close()
    opts = ProgramOptions(arch="sm_90", std="c++17", include_path=[inc])
    key = make_program_cache_key(code=kernel, code_type="c++", options=opts, target_type="cubin", extra_digest=b"cute")
    FileStreamProgramCache(f"{base}/peer-hit")[key] = (Path(art.path) / "artifact.cubin").read_bytes()
    times: dict[str, list[float]] = {"safejit": [], "peer": []}
    for _ in range(runs):
        for mode, cache in (("safejit", ours), ("peer", f"{base}/peer-hit")):
            out = subprocess.run(
                [sys.executable, "-c", CUTE_DISK_CHILD, mode, cache, inc, kernel],
                capture_output=True,
                text=True,
                check=True,
            )
            times[mode].append(json.loads(out.stdout)["seconds"])
    ms, peer_ms = statistics.median(times["safejit"]) * 1e3, statistics.median(times["peer"]) * 1e3
    results["cute_disk_hit_ms"] = round(ms, 3)
    results["cute_disk_hit_vs_cuda_core"] = round(ms / peer_ms, 3)
    print(
        f"cute disk hit (fresh)   {ms / peer_ms:8.3f} x    ({ms:.2f} ms verified vs FileStreamProgramCache "
        f"{peer_ms:.2f} ms; median of {runs} processes each)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    parser.add_argument("--only", nargs="*", help="run only these sections: memory calls disk cold procs16 telemetry "
                        "verify prune cuda cute")  # fmt: skip
    args = parser.parse_args()
    results: dict[str, Any] = {}
    sections = {
        "memory": lambda: memory_hit(results, args.quick),
        "calls": lambda: host_calls(results, args.quick),
        "disk": lambda: (
            disk_hit(results, "host_disk_hit_ms", 1, 5 if args.quick else 15),
            disk_hit(results, "host_disk_hit_1000_headers_ms", 1000, 3 if args.quick else 9),
        ),
        "cold": lambda: cold_overhead(results, 5 if args.quick else 41),
        "procs16": lambda: procs16(results),
        "telemetry": lambda: telemetry(results, 2 if args.quick else 6, args.quick),
        "verify": lambda: verify_throughput(results, args.quick),
        "prune": lambda: prune_throughput(results, args.quick),
        "cuda": lambda: cuda_tiers(results, args.quick),
        "cute": lambda: cute(results, args.quick),
    }
    for name, section in sections.items():
        if not args.only or name in args.only:
            section()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
