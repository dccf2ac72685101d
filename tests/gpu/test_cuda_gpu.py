"""CUDA end to end on a real GPU: correctness, torch and CuPy interop, the disk
tier across processes, and 8 processes cold-starting one kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import safejit
from tests.conftest import assert_cache_sound, leaves
from tests.gpu._together import run_together

SAXPY = """#include "scale.h"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] * SCALE + y[i];
}
template <typename T> __global__ void axpb(T* x, T a, T b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}
"""


@pytest.fixture
def cuda_root(tmp_path: Path) -> Path:
    root = tmp_path / "cu"
    (root / "include").mkdir(parents=True)
    (root / "include" / "scale.h").write_text("#define SCALE 1.0f\n")
    return root


@pytest.fixture(params=["nvrtc", "nvcc"])
def rt(request, make_runtime, cuda_root) -> safejit.Runtime:
    return make_runtime(backend="cuda", cuda_compiler=request.param, source_roots=(str(cuda_root),))


def _saxpy(rt: safejit.Runtime, root: Path) -> safejit.Module:
    return rt.compile(safejit.Source(SAXPY, "saxpy"), include_dirs=(str(root / "include"),))


def test_saxpy_with_torch_tensors_and_streams(rt, cuda_root):
    torch = pytest.importorskip("torch")
    n = 1 << 20
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    y = torch.ones(n, device="cuda", dtype=torch.float32)
    k = _saxpy(rt, cuda_root).kernel("saxpy")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        k.launch(((n + 255) // 256,), (256,), (2.0, x, y, n))  # stream=None: torch's current stream
    stream.synchronize()
    assert torch.equal(y, 2.0 * x + 1.0)
    k.launch(((n + 255) // 256,), (256,), (1.0, x, y, n), stream=stream)  # a torch.cuda.Stream object
    stream.synchronize()
    assert torch.equal(y, 3.0 * x + 1.0)


def test_templated_kernel_through_name_expressions(make_runtime, cuda_root):
    torch = pytest.importorskip("torch")
    rt = make_runtime(backend="cuda", source_roots=(str(cuda_root),))
    mod = rt.compile(
        safejit.Source(SAXPY, "saxpy"),
        include_dirs=(str(cuda_root / "include"),),
        name_expressions=("axpb<float>", "axpb<double>"),
    )
    for dtype, name in ((torch.float32, "axpb<float>"), (torch.float64, "axpb<double>")):
        x = torch.arange(1000, device="cuda", dtype=dtype)
        mod.kernel(name).launch((4,), (256,), (x, 3.0, 0.5, 1000))
        torch.cuda.synchronize()
        assert torch.equal(x, 3.0 * torch.arange(1000, device="cuda", dtype=dtype) + 0.5)


def test_cupy_arrays_and_a_cupy_stream(rt, cuda_root):
    cp = pytest.importorskip("cupy")
    n = 4096
    x = cp.arange(n, dtype=cp.float32)
    y = cp.zeros(n, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    _saxpy(rt, cuda_root).kernel("saxpy").launch((n // 256,), (256,), (0.5, x, y, n), stream=stream)
    stream.synchronize()
    assert cp.allclose(y, 0.5 * x)


def test_width_checked_arguments_on_the_gpu(rt, cuda_root):
    torch = pytest.importorskip("torch")
    k = _saxpy(rt, cuda_root).kernel("saxpy")
    x = torch.zeros(8, device="cuda")
    with pytest.raises(safejit.ConfigError):
        k.launch((1,), (8,), (1.0, x, x, 2**40))  # n is an int (4 bytes): never truncated silently


DISK_CHILD = r"""
import json, sys, time
import torch, safejit
root, cache = sys.argv[1], sys.argv[2]
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(root,)))
t0 = time.perf_counter()
k = rt.compile(safejit.Source(sys.argv[3], "saxpy"), include_dirs=(root + "/include",)).kernel("saxpy")
t1 = time.perf_counter()
x = torch.ones(256, device="cuda"); y = torch.zeros(256, device="cuda")
k.launch((1,), (256,), (4.0, x, y, 256)); torch.cuda.synchronize()
print(json.dumps({"ok": bool((y == 4.0).all()), "stats": dict(rt.stats()), "seconds": t1 - t0}))
"""


def test_a_fresh_process_hits_the_disk_tier(make_runtime, cuda_root, cache_dir):
    pytest.importorskip("torch")
    make_runtime(backend="cuda", source_roots=(str(cuda_root),)).build(
        safejit.Source(SAXPY, "saxpy"), include_dirs=(str(cuda_root / "include"),)
    )
    out = subprocess.run(
        [sys.executable, "-c", DISK_CHILD, str(cuda_root), str(cache_dir), SAXPY],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["stats"]["disk_hits"] == 1 and report["stats"]["compiles"] == 0


COLD_CHILD = r"""
import json, os, sys, time
import torch, safejit
go, root, cache = sys.argv[1], sys.argv[2], sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.001)
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(cache,), source_roots=(root,)))
k = rt.compile(safejit.Source(sys.argv[4], "saxpy"), include_dirs=(root + "/include",)).kernel("saxpy")
x = torch.ones(256, device="cuda"); y = torch.ones(256, device="cuda")
k.launch((1,), (256,), (2.0, x, y, 256)); torch.cuda.synchronize()
print(json.dumps({"ok": bool((y == 3.0).all()), "compiles": rt.stats()["compiles"]}))
"""


def test_eight_processes_cold_start_one_kernel_and_compile_once(cuda_root, cache_dir, tmp_path):
    pytest.importorskip("torch")
    reports = run_together(COLD_CHILD, tmp_path / "go", str(cuda_root), str(cache_dir), SAXPY)
    assert all(r["ok"] for r in reports)
    assert sum(r["compiles"] for r in reports) == 1
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


CLUSTER = """extern "C" __global__ void __cluster_dims__(2, 1, 1) twice(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }
extern "C" __global__ void plain(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
"""


def test_cluster_and_cooperative_launches(make_runtime):
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("clusters need sm_90")
    rt = make_runtime(backend="cuda")
    mod = rt.compile(safejit.Source(CLUSTER, "cluster"))
    x = torch.ones(512, device="cuda")
    mod.kernel("plain").launch((2,), (256,), (x, 512), cluster=(2, 1, 1))
    mod.kernel("plain").launch((2,), (256,), (x, 512), cooperative=True)
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 3.0))


def test_module_close_unloads_and_kernels_refuse_afterwards(make_runtime, cuda_root):
    rt = make_runtime(backend="cuda", source_roots=(str(cuda_root),))
    mod = _saxpy(rt, cuda_root)
    mod.kernel("saxpy")
    mod.close()
    with pytest.raises(safejit.LoadError):
        mod.kernel("saxpy")
    mod.close()  # twice is fine
    assert os.environ.get("SAFEJIT_FAULTS") is None


def test_prepared_launch_repeats_with_its_packed_arguments(rt, cuda_root):
    torch = pytest.importorskip("torch")
    n = 4096
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    stream = torch.cuda.Stream()
    launch = _saxpy(rt, cuda_root).kernel("saxpy").prepare((n // 256,), (256,), (1.0, x, y, n), stream=stream)
    for _ in range(3):
        launch()
    stream.synchronize()
    assert torch.equal(y, torch.full_like(y, 3.0))


def test_repeated_launches_with_changing_argument_types_stay_correct(rt, cuda_root):
    """Each call's argument types pick a packing plan: switching between torch tensors,
    CuPy arrays, NumPy scalars and plain numbers (and back) must never reuse the wrong one."""
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    np = pytest.importorskip("numpy")
    n = 2048
    kernel = _saxpy(rt, cuda_root).kernel("saxpy")
    tx, ty = torch.arange(n, dtype=torch.float32, device="cuda"), torch.zeros(n, device="cuda")
    cx, cy = cp.arange(n, dtype=cp.float32), cp.zeros(n, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    for round_ in range(3):
        kernel.launch((n // 256,), (256,), (1.0, tx, ty, n))
        kernel.launch((n // 256,), (256,), (np.float32(2.0), cx, cy, np.int32(n)), stream=stream)
        kernel.launch((n // 256,), (256,), (0.5, cx, cy, n), stream=stream)
        stream.synchronize()
        torch.cuda.synchronize()
        assert torch.allclose(ty, tx * (round_ + 1))
        assert cp.allclose(cy, cx * 2.5 * (round_ + 1))
    with pytest.raises(safejit.ConfigError):
        kernel.launch((n // 256,), (256,), (1.0, tx, ty, 2**40))  # too wide for int, after plans exist
