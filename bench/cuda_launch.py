"""Kernel launch overhead on a GPU: safejit's packed-argument launch against
cuda.core's ``launch`` on the same kernel, measured in the same run.

    python bench/cuda_launch.py        (needs an NVIDIA GPU, torch and cuda-core)
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
import torch
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

import safejit

CODE = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }'  # noqa: E501
N = 1 << 20


def _time(fn, sync) -> float:
    for _ in range(100):
        fn()
    sync()
    means = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(1000):
            fn()
        means.append((time.perf_counter() - t0) / 1000 * 1e6)
    sync()
    return statistics.median(means)


def main() -> None:
    x = torch.ones(N, device="cuda")
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(tempfile.mkdtemp(),)))
    k = rt.compile(safejit.Source(CODE, "scale")).kernel("scale")
    ours = _time(lambda: k.launch((N // 256,), (256,), (x, 1.0, N)), torch.cuda.synchronize)
    dev = Device(0)
    dev.set_current()
    ck = Program(CODE, "c++", options=ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin").get_kernel("scale")
    stream = dev.create_stream()
    cfg = LaunchConfig(grid=N // 256, block=256)
    ptr, a, n = x.data_ptr(), np.float32(1.0), np.int32(N)
    peer = _time(lambda: launch(stream, cfg, ck, ptr, a, n), stream.sync)
    print(f"launch: safejit {ours:.2f} us, cuda.core {peer:.2f} us, ratio {ours / peer:.2f}")


if __name__ == "__main__":
    main()
