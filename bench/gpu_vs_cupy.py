"""safejit against CuPy's RawKernel on the GPU machine, same kernel, same run:
cold compile, fresh-process disk hit (context creation excluded), in-process
re-get, and µs per launch against raw cuda.bindings cuLaunchKernel with a
prepacked argument array.

    python bench/gpu_vs_cupy.py [--json OUT]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CODE = 'extern "C" __global__ void axpy(float a, const float* x, float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }'  # noqa: E501
N = 1 << 20

CHILD = r"""
import json, os, sys, time
mode, cache, code = sys.argv[1], sys.argv[2], sys.argv[3]
import cupy as cp
cp.cuda.runtime.free(cp.cuda.runtime.malloc(1))  # create the context before timing
if mode == "safejit":
    import safejit, safejit.backends.cuda
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,)))
    t0 = time.perf_counter()
    k = rt.compile(safejit.Source(code, "axpy")).kernel("axpy")
    t1 = time.perf_counter()
    assert rt.stats()["compiles"] == 0
else:
    os.environ["CUPY_CACHE_DIR"] = cache
    t0 = time.perf_counter()
    k = cp.RawKernel(code, "axpy")
    k.compile()
    t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
"""


def _per_call(fns: dict, n: int = 1000, rounds: int = 31, drain=lambda: None) -> dict:
    """Median seconds per call of each function, measured in interleaved rounds (one
    round of each in turn), so that the host's drifting speed weighs on all alike.
    ``drain`` runs between rounds, untimed (a launch round must not queue behind another)."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    out: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[name].append((time.perf_counter() - t0) / n)
            drain()
    return {name: statistics.median(v) for name, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp())
    os.environ["CUPY_CACHE_DIR"] = str(base / "cupy-parent")  # CuPy's cold compile must really be cold
    import cupy as cp
    from cuda.bindings import driver

    import safejit

    results: dict[str, float] = {}
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(str(base / "ours"),)))
    # Cold compile: fresh sources each time (new constants in every run: NVRTC may keep
    # its own cache of compiled code, the driver's ComputeCache), alternating.
    ours, theirs = [], []
    salt = random.SystemRandom().randrange(1 << 20)
    for i in range(7):
        t0 = time.perf_counter()
        rt.compile(safejit.Source(CODE.replace("a * x[i]", f"a * x[i] + {salt + i}.0f"), "axpy"))
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cp.RawKernel(CODE.replace("a * x[i]", f"a * x[i] - {salt + i}.0f"), "axpy").compile()
        theirs.append(time.perf_counter() - t0)
    results["cold_ms"] = statistics.median(ours) * 1e3
    results["cupy_cold_ms"] = statistics.median(theirs) * 1e3
    # Fresh-process disk hit, context creation excluded.
    rt.build(safejit.Source(CODE, "axpy"))
    subprocess.run([sys.executable, "-c", CHILD, "cupy", str(base / "cupy"), CODE], check=True, capture_output=True)
    disk: dict[str, list[float]] = {"safejit": [], "cupy": []}
    for _ in range(7):
        for mode, cache in (("safejit", base / "ours"), ("cupy", base / "cupy")):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, str(cache), CODE], check=True, capture_output=True, text=True
            )
            disk[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    results["disk_hit_ms"] = statistics.median(disk["safejit"]) * 1e3
    results["cupy_disk_hit_ms"] = statistics.median(disk["cupy"]) * 1e3
    # In-process re-get of an already-known kernel.
    src = safejit.Source(CODE, "axpy")
    reget = _per_call(
        {"ours": lambda: rt.compile(src).kernel("axpy"), "cupy": lambda: cp.RawKernel(CODE, "axpy").kernel}
    )
    results["reget_us"] = reget["ours"] * 1e6
    results["cupy_reget_us"] = reget["cupy"] * 1e6
    # Launch: safejit vs raw cuLaunchKernel with a prepacked void* array.
    x = cp.ones(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    k = rt.compile(src).kernel("axpy")
    stream = cp.cuda.Stream(non_blocking=True)
    cuk = cp.RawKernel(CODE, "axpy")
    cuk.compile()
    import numpy as np

    fn = driver.CUfunction(int(k._fn))
    a, ptr_x, ptr_y, n = ctypes.c_float(2.0), ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(y.data.ptr), ctypes.c_int(N)
    packed = np.array([ctypes.addressof(v) for v in (a, ptr_x, ptr_y, n)], dtype=np.uint64)
    handle = stream.ptr

    def raw() -> None:
        driver.cuLaunchKernel(fn, N // 256, 1, 1, 256, 1, 1, 0, handle, packed.ctypes.data, 0)

    prepared = k.prepare((N // 256,), (256,), (2.0, x, y, N), stream=stream)
    launch = _per_call(
        {
            "ours": lambda: k.launch((N // 256,), (256,), (2.0, x, y, N), stream=stream),
            "cupy": lambda: cuk((N // 256,), (256,), (cp.float32(2.0), x, y, cp.int32(N)), stream=stream),
            "raw": raw,
            "prepared": prepared,
        },
        drain=stream.synchronize,
    )
    results["launch_us"] = launch["ours"] * 1e6
    results["cupy_launch_us"] = launch["cupy"] * 1e6
    results["raw_launch_us"] = launch["raw"] * 1e6
    results["prepared_launch_us"] = launch["prepared"] * 1e6
    results["prepared_vs_raw"] = results["prepared_launch_us"] / results["raw_launch_us"]
    stream.synchronize()
    results["disk_hit_vs_cupy"] = results["disk_hit_ms"] / results["cupy_disk_hit_ms"]
    results["reget_vs_cupy"] = results["reget_us"] / results["cupy_reget_us"]
    results["launch_vs_raw"] = results["launch_us"] / results["raw_launch_us"]
    print("| measure | safejit | CuPy RawKernel | raw cuLaunchKernel | ratio (target) |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| cold compile | {results['cold_ms']:.1f} ms | {results['cupy_cold_ms']:.1f} ms | | "
        f"{results['cold_ms'] / results['cupy_cold_ms']:.2f} |"
    )
    print(
        f"| fresh-process disk hit | {results['disk_hit_ms']:.2f} ms | {results['cupy_disk_hit_ms']:.2f} ms | | "
        f"{results['disk_hit_vs_cupy']:.2f} (≤ 0.5) |"
    )
    print(
        f"| in-process re-get | {results['reget_us']:.2f} us | {results['cupy_reget_us']:.2f} us | | "
        f"{results['reget_vs_cupy']:.2f} (≤ 1.0) |"
    )
    print(
        f"| launch | {results['launch_us']:.2f} us | {results['cupy_launch_us']:.2f} us | "
        f"{results['raw_launch_us']:.2f} us | {results['launch_vs_raw']:.2f} (≤ 1.0 vs raw) |"
    )
    print(
        f"| prepared launch | {results['prepared_launch_us']:.2f} us | | {results['raw_launch_us']:.2f} us | "
        f"{results['prepared_vs_raw']:.2f} (≤ 1.0 vs raw) |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
