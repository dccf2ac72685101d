"""The CuTe SGEMM (tests/data/cute_sgemm.cu, nvidia-cutlass headers) on the GPU machine,
peers measured in the same run: a fresh process's cache hit to a launchable kernel
(context creation excluded) through safejit (verified: every header rehashed or
stat-trusted, negatives checked), CuPy RawModule (its cache keys the source and
options, not the headers) and cuda.core (FileStreamProgramCache with a constant
extra_digest, ObjectCode.from_cubin, get_kernel); the cold compiles; and 8 processes
cold-starting the kernel at once (compiler runs in total: 1).

    python bench/gpu_cute.py [--json OUT] [--runs 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = (Path(__file__).resolve().parent.parent / "tests" / "data" / "cute_sgemm.cu").read_text()
NAME = "cute_sgemm_nt"

HIT_CHILD = r"""
import json, os, sys, time
mode, cache, inc, extra, code = sys.argv[1:6]
from cuda.bindings import driver
driver.cuInit(0); _, dev = driver.cuDeviceGet(0)
_, ctx = driver.cuDevicePrimaryCtxRetain(dev); driver.cuCtxSetCurrent(ctx)  # the context, before timing
if mode == "safejit":
    import safejit, safejit.backends.cuda.backend  # the libraries imported before timing, as the peers' are
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(inc,)))
    t0 = time.perf_counter()
    k = rt.compile(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), flags=("-std=c++17",)).kernel("NAME")
    t1 = time.perf_counter()
    assert rt.stats()["compiles"] == 0, rt.stats()
elif mode == "cupy":
    os.environ["CUPY_CACHE_DIR"] = cache
    import cupy as cp
    t0 = time.perf_counter()
    opts = ("-std=c++17", "-default-device", *("-I" + d for d in [inc, *extra.split(os.pathsep)]))
    k = cp.RawModule(code=code, options=opts).get_function("NAME")
    t1 = time.perf_counter()
else:
    from cuda.core import Device, ObjectCode, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    Device(0).set_current()
    peer = FileStreamProgramCache(cache)
    t0 = time.perf_counter()
    opts = ProgramOptions(std="c++17", include_path=[inc], arch="sm_" + Device(0).arch)
    key = make_program_cache_key(code=code, code_type="c++", options=opts, target_type="cubin", extra_digest=b"cute")
    k = ObjectCode.from_cubin(peer.get(key)).get_kernel("NAME")
    t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
""".replace("NAME", NAME)

COLD_CHILD = r"""
import json, os, sys, time
import safejit
go, cache, inc, code = sys.argv[1:5]
while not os.path.exists(go):
    time.sleep(0.001)
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(inc,)))
t0 = time.perf_counter()
rt.compile(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), flags=("-std=c++17",)).kernel("NAME")
print(json.dumps({"compiles": rt.stats()["compiles"], "seconds": time.perf_counter() - t0}))
""".replace("NAME", NAME)


def _child(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *args], check=False, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{args[0]} child failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _first_error(log: str) -> str:
    return next((line.strip() for line in log.splitlines() if "error" in line), log.strip()[-200:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    spec = importlib.util.find_spec("cutlass_library")
    assert spec is not None and spec.origin is not None, "pip install nvidia-cutlass"
    inc = str((Path(spec.origin).parent / "source" / "include").resolve())
    from cuda.core import Device, Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    from cuda.pathfinder import find_nvidia_header_directory

    import safejit

    cccl = str(find_nvidia_header_directory("cccl"))
    cudart = str(find_nvidia_header_directory("cudart"))
    base = Path(tempfile.mkdtemp())
    results: dict[str, float] = {}
    Device(0).set_current()
    arch = "sm_" + Device(0).arch

    # Cold compiles: a new source each round whose PTX is new too (a comment would leave it
    # alike, and cuda.core's NVRTC, in this process with the driver up, would take the cubin
    # from the driver's ComputeCache without running ptxas: bench/nvrtc_worker_cost.py).
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(str(base / "cold"),), source_roots=(inc,)))
    rt.build(safejit.Source('extern "C" __global__ void k() {}', "k"))  # the worker up
    extra = [cudart, os.path.dirname(cccl), cccl]  # <cccl/...> needs the directory above CCCL's
    opts = ProgramOptions(  # safejit's own NVRTC options
        std="c++17",
        include_path=[inc, *extra],
        arch=arch,
        device_as_default_execution_space=True,
        ptxas_options="-v",
    )
    ours, peer = [], []
    salt = random.SystemRandom().randrange(1 << 30)
    for i in range(5):
        code = f"{KERNEL}\n__device__ int cute_bench_salt = {salt + 2 * i};\n"
        t0 = time.perf_counter()
        rt.build(safejit.Source(code, "cute_sgemm"), include_dirs=(inc,), flags=("-std=c++17",))
        ours.append(time.perf_counter() - t0)
        code = f"{KERNEL}\n__device__ int cute_bench_salt = {salt + 2 * i + 1};\n"
        t0 = time.perf_counter()
        compiled = Program(code, "c++", options=opts).compile("cubin", logs=(log := io.StringIO()))
        peer.append(time.perf_counter() - t0)
        assert compiled.code and "Compiling entry function" in log.getvalue(), "the peer's ptxas did not run"
    results["cold_s"] = statistics.median(ours)
    results["cuda_core_cold_s"] = statistics.median(peer)
    rt.close()

    # Fresh-process hits: each cache filled once, then hit by new processes in turn.
    ours_cache, cupy_cache, core_cache = str(base / "ours"), str(base / "cupy"), str(base / "core")
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(ours_cache,), source_roots=(inc,)))
    art = rt.build(safejit.Source(KERNEL, "cute_sgemm"), include_dirs=(inc,), flags=("-std=c++17",))
    rt.close()
    core_opts = ProgramOptions(std="c++17", include_path=[inc], arch=arch)
    key = make_program_cache_key(
        code=KERNEL, code_type="c++", options=core_opts, target_type="cubin", extra_digest=b"cute"
    )
    FileStreamProgramCache(core_cache)[key] = (Path(art.path) / "artifact.cubin").read_bytes()
    peers = [("safejit", ours_cache), ("cupy", cupy_cache), ("cuda.core", core_cache)]
    cupy_failed = ""
    try:
        _child(HIT_CHILD, "cupy", cupy_cache, inc, os.pathsep.join(extra), KERNEL)  # CuPy compiles into its cache once
    except RuntimeError as exc:  # (CuPy's own CCCL comes first on its include path: CUTLASS 4 may not build)
        cupy_failed = _first_error(str(exc))
        peers.remove(("cupy", cupy_cache))
    hits: dict[str, list[float]] = {mode: [] for mode, _ in peers}
    for _ in range(args.runs):
        for mode, cache in peers:
            hits[mode].append(_child(HIT_CHILD, mode, cache, inc, os.pathsep.join(extra), KERNEL)["seconds"])
    for mode, times in hits.items():
        results[f"{mode}_hit_ms"] = statistics.median(times) * 1e3
    if not cupy_failed:
        results["hit_vs_cupy"] = results["safejit_hit_ms"] / results["cupy_hit_ms"]
    results["hit_vs_cuda_core"] = results["safejit_hit_ms"] / results["cuda.core_hit_ms"]

    # 8 processes cold-starting the kernel at once.
    go, cache = base / "go", str(base / "eight")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COLD_CHILD, str(go), cache, inc, KERNEL], stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    time.sleep(3)
    go.touch()
    reports = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    results["procs8_compiles"] = sum(r["compiles"] for r in reports)
    results["procs8_slowest_s"] = max(r["seconds"] for r in reports)

    print("| measure | safejit | CuPy RawModule | cuda.core | ratio |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| cold compile | {results['cold_s']:.2f} s | | {results['cuda_core_cold_s']:.2f} s (no cache) | "
        f"{results['cold_s'] / results['cuda_core_cold_s']:.2f} |"
    )
    cupy = f"{results['cupy_hit_ms']:.2f} ms" if not cupy_failed else f"compile failed: {cupy_failed[:160]}"
    vs_cupy = f"{results['hit_vs_cupy']:.2f} vs CuPy, " if not cupy_failed else ""
    print(
        f"| fresh-process hit | {results['safejit_hit_ms']:.2f} ms | {cupy} | "
        f"{results['cuda.core_hit_ms']:.2f} ms | {vs_cupy}"
        f"{results['hit_vs_cuda_core']:.2f} vs cuda.core |"
    )
    print(
        f"| 8 processes cold | {results['procs8_compiles']:.0f} compile(s), slowest {results['procs8_slowest_s']:.2f} s"
        " | | | (1) |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
