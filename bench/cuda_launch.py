"""Per-call launch time on a GPU: safejit's ``kernel.launch`` against cuda.core's
``launch`` of the same cubin, measured in the same run.

    python bench/cuda_launch.py [--json OUT] [--batches 41] [--per-batch 1000]

Method, as cuda.core's own launch benchmarks (benchmarks/cuda_core/bench_launch.py):
a tiny kernel (one block of 32 threads) so that the GPU never holds the host back;
a batch of launches timed with ``time.perf_counter``; the stream synchronized before
each batch, outside the timed loop; the variants interleaved batch by batch, so that
drifting clocks weigh on all alike; each variant's result is the median of its
batches' per-launch means.

Keys (``--json``):
  launch_vs_cuda_core        safejit ``k.launch((1,), (32,), (x, 1.0, n), stream=S)`` — a torch tensor, a
                             Python float and int, packed by the cubin's widths on every call — divided by
                             cuda.core ``launch(S, config, kernel, ptr, np.float32(1.0), np.int32(n))`` with
                             exact-width arguments made once, on the same cuda.core stream S (target <= 1.0)
  launch_vs_cuda_core_paired   the median of each safejit batch's ratio to the cuda.core batch after it
  launch_us, cuda_core_launch_us   the two, in microseconds per launch
  torch_stream_vs_cuda_core  safejit with ``stream=None`` inside ``torch.cuda.stream(...)``: torch's current stream
  python_path_vs_cuda_core   safejit's Python launch path (the fallback where the C path cannot be built)
  cuda_core_same_inputs_vs_cuda_core   cuda.core making its arguments from the same inputs on every call
                             (``x.data_ptr()``, ``np.float32(a)``, ``np.int32(n)``): what a cuda.core user pays
  raw_bindings_vs_cuda_core  cuda.bindings ``cuLaunchKernel`` with a params array packed once (no packing)
  c_path                     whether safejit's C launch path was in use
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from cuda.bindings import driver
from cuda.core import Device, LaunchConfig, ObjectCode, launch

import safejit

CODE = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }'  # noqa: E501
N = 32


def per_launch_us(
    variants: dict[str, Callable[[], None]], sync: Callable[[], None], batches: int, per: int
) -> dict[str, list[float]]:
    """Each batch's mean microseconds per launch, by variant, the variants interleaved."""
    for fn in variants.values():  # warm up: plans made, caches filled
        for _ in range(200):
            fn()
    sync()
    means: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(batches):
        for name, fn in variants.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(per):
                fn()
            means[name].append((time.perf_counter() - t0) / per * 1e6)
    sync()
    return means


def paired(ours: list[float], theirs: list[float]) -> float:
    """The median of each batch's ratio to the peer's batch right after it."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--batches", type=int, default=41)
    parser.add_argument("--per-batch", type=int, default=1000)
    opts = parser.parse_args()

    x = torch.ones(N, device="cuda")
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(tempfile.mkdtemp(),)))
    mod = rt.compile(safejit.Source(CODE, "scale"))
    k = mod.kernel("scale")
    cubin = (Path(mod.artifact.path) / "artifact.cubin").read_bytes()  # the same cubin, for cuda.core

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    ck = ObjectCode.from_cubin(cubin).get_kernel("scale")
    config = LaunchConfig(grid=1, block=32)
    ptr, a, n = x.data_ptr(), np.float32(1.0), np.int32(N)
    torch_stream = torch.cuda.Stream()

    # cuda.bindings with a params array packed once: the driver call alone.
    packed = ctypes.create_string_buffer(struct.pack("<Qfi", ptr, 1.0, N), 16)
    base = ctypes.addressof(packed)
    params = (ctypes.c_void_p * 3)(base, base + 8, base + 12)
    fn = driver.CUfunction(int(ck.handle))
    raw_stream = driver.CUstream(int(stream.handle))
    raw = driver.cuLaunchKernel

    def torch_current() -> None:
        with torch.cuda.stream(torch_stream):
            k.launch((1,), (32,), (x, 1.0, N))

    torch.cuda.synchronize()
    variants = {
        "safejit": lambda: k.launch((1,), (32,), (x, 1.0, N), stream=stream),
        "cuda_core": lambda: launch(stream, config, ck, ptr, a, n),
        "python_path": lambda: k.launch_python((1,), (32,), (x, 1.0, N), stream=stream),
        "cuda_core_same_inputs": lambda: launch(stream, config, ck, x.data_ptr(), np.float32(1.0), np.int32(N)),
        "raw_bindings": lambda: raw(fn, 1, 1, 1, 32, 1, 1, 0, raw_stream, ctypes.addressof(params), 0),
    }

    def sync() -> None:
        stream.sync()
        torch.cuda.synchronize()

    batches = per_launch_us(variants, sync, opts.batches, opts.per_batch)
    us = {name: statistics.median(values) for name, values in batches.items()}
    with torch.cuda.stream(torch_stream):
        torch_batches = per_launch_us(
            {"torch_stream": lambda: k.launch((1,), (32,), (x, 1.0, N)), "cuda_core": variants["cuda_core"]},
            sync,
            opts.batches,
            opts.per_batch,
        )
    torch_us = {name: statistics.median(values) for name, values in torch_batches.items()}
    torch.cuda.synchronize()
    assert torch.equal(x, torch.ones_like(x))  # every launch scaled by 1.0: the kernel ran with these arguments

    peer = us["cuda_core"]
    report = {
        "launch_vs_cuda_core": us["safejit"] / peer,
        "launch_vs_cuda_core_paired": paired(batches["safejit"], batches["cuda_core"]),
        "launch_us": us["safejit"],
        "cuda_core_launch_us": peer,
        "torch_stream_vs_cuda_core": torch_us["torch_stream"] / torch_us["cuda_core"],
        "python_path_vs_cuda_core": us["python_path"] / peer,
        "cuda_core_same_inputs_vs_cuda_core": us["cuda_core_same_inputs"] / peer,
        "raw_bindings_vs_cuda_core": us["raw_bindings"] / peer,
        "c_path": type(k.launch).__name__ == "builtin_function_or_method",
        "method": f"median of {opts.batches} interleaved batches of {opts.per_batch} launches, "
        "stream synchronized before each batch (untimed), grid 1 x block 32",
        "versions": {
            "cuda.core": _version("cuda.core"),
            "cuda.bindings": _version("cuda.bindings"),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(),
        },
    }
    for name, value in us.items():
        print(f"{name:24s} {value:7.3f} us/launch   {value / peer:5.2f} x cuda.core")
    torch_ratio = report["torch_stream_vs_cuda_core"]
    print(f"{'torch_stream':24s} {torch_us['torch_stream']:7.3f} us/launch   {torch_ratio:5.2f} x cuda.core")
    print(
        f"launch_vs_cuda_core {report['launch_vs_cuda_core']:.3f}"
        f"  (paired by batch: {report['launch_vs_cuda_core_paired']:.3f}; C path: {report['c_path']})"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=2) + "\n")
    rt.close()


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name.replace(".", "-"))
    except metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
