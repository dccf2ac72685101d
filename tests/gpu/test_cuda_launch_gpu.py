"""The launch path on a real GPU: the C path's results against a reference (torch,
CuPy, NumPy scalars, each kind of stream, many threads at once), width errors that
launch nothing, the kernel as a cuda.core Kernel, and close unloading the cubin."""

from __future__ import annotations

import threading

import pytest

import safejit

AXPB = """
extern "C" __global__ void axpb(float a, const float* x, float* y, int n, double b) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + (float)b;
}
__device__ char big[256 << 20];
extern "C" __global__ void touch(int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) big[i] = 1;
}
"""


@pytest.fixture
def module(make_runtime) -> safejit.Module:
    return make_runtime(backend="cuda").compile(safejit.Source(AXPB, "axpb"))


def _blocks(n: int) -> tuple[int]:
    return ((n + 255) // 256,)


def test_launch_c_path_matches_torch_on_every_kind_of_stream(module):
    torch = pytest.importorskip("torch")
    from cuda.core import Device

    k = module.kernel("axpb")
    assert type(k.launch).__name__ == "builtin_function_or_method", "the C launch path was not built"
    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.empty(n, device="cuda")
    torch_stream = torch.cuda.Stream()
    core = Device(0)
    core.set_current()
    core_stream = core.create_stream()
    torch.cuda.synchronize()  # x is written on the default stream; the streams below do not wait for it
    streams = [None, torch_stream, int(torch_stream.cuda_stream), core_stream]
    for i in range(12):  # the first call of each new kind teaches the C path; the rest take it
        a, b = 0.5 + i, float(-i)
        stream = streams[i % len(streams)]
        if stream is None:
            with torch.cuda.stream(torch_stream):  # None: torch's current stream
                k.launch(_blocks(n), (256,), (a, x, y, n, b))
        else:
            k.launch(_blocks(n), (256,), (a, x, y, n, b), stream=stream)
        (core_stream.sync() if stream is core_stream else torch_stream.synchronize())
        torch.testing.assert_close(y, a * x + b)


def test_launch_c_path_with_cupy_arrays_numpy_scalars_and_a_cupy_stream(module):
    cp = pytest.importorskip("cupy")
    np = pytest.importorskip("numpy")
    k = module.kernel("axpb")
    n = 4097
    x = cp.arange(n, dtype=cp.float32)
    y = cp.zeros(n, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    for a in (2.0, 3.0, 4.0):
        k.launch(_blocks(n), (256,), (np.float32(a), x, y, np.int32(n), np.float64(1.0)), stream=stream)
        stream.synchronize()
        assert cp.allclose(y, a * x + 1.0)


def test_launch_c_path_from_many_threads_at_once(module):
    torch = pytest.importorskip("torch")
    k = module.kernel("axpb")
    n = 1 << 16
    x = torch.randn(n, device="cuda")
    outs = [torch.empty(n, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    failures: list[BaseException] = []

    def work(t: int) -> None:
        try:
            stream = torch.cuda.Stream()
            for i in range(200):
                k.launch(_blocks(n), (256,), (float(t), x, outs[t], n, float(i)), stream=stream)
            stream.synchronize()
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    for t, out in enumerate(outs):
        torch.testing.assert_close(out, t * x + 199.0)


def test_launch_width_mismatch_on_the_c_path_raises_and_launches_nothing(module):
    torch = pytest.importorskip("torch")
    k = module.kernel("axpb")
    n = 1024
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    k.launch(_blocks(n), (256,), (1.0, x, y, n, 0.0))
    k.launch(_blocks(n), (256,), (2.0, x, y, n, 0.0))  # the C path
    torch.cuda.synchronize()
    np = pytest.importorskip("numpy")
    for bad in [
        (3.0, x, y, 2**40, 0.0),  # an int wider than the int parameter
        (3.0, x, y, -(2**31) - 1, 0.0),
        (3.0, x, y, n, np.float32(0.0)),  # a 4-byte scalar for the double
        (x, x, y, n, 0.0),  # a pointer for the float
        (3.0, x, y, n),  # one short
    ]:
        with pytest.raises(safejit.ConfigError):
            k.launch(_blocks(n), (256,), bad)
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 2.0))


def test_launch_cuda_core_kernel_runs_under_cuda_core(module):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from cuda.core import Device, LaunchConfig, launch

    k = module.kernel("axpb")
    n = 5000
    x = torch.randn(n, device="cuda")
    y = torch.empty(n, device="cuda")
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    config = LaunchConfig(grid=_blocks(n), block=256)
    torch.cuda.synchronize()
    launch(stream, config, k.cuda_core_kernel, np.float32(3.0), x.data_ptr(), y.data_ptr(), np.int32(n), 0.5)
    stream.sync()
    torch.testing.assert_close(y, 3.0 * x + 0.5)
    assert k.cuda_core_kernel.num_arguments == 5


def test_launch_close_unloads_the_cubin_and_its_kernels_refuse(make_runtime):
    torch = pytest.importorskip("torch")
    from cuda.bindings import driver

    rt = make_runtime(backend="cuda")
    torch.cuda.synchronize()
    free_before = driver.cuMemGetInfo()[1]
    mod = rt.compile(safejit.Source(AXPB, "big"))
    touch = mod.kernel("touch")
    touch.launch((1024,), (256,), (256 << 20,))
    torch.cuda.synchronize()
    free_loaded = driver.cuMemGetInfo()[1]
    mod.close()
    torch.cuda.synchronize()
    free_closed = driver.cuMemGetInfo()[1]
    assert free_before - free_loaded >= 200 << 20  # the 256 MiB __device__ array
    assert free_closed - free_loaded >= 200 << 20  # given back by cuLibraryUnload
    refused = (lambda: touch.launch((1,), (32,), (1,)), lambda: touch.cuda_core_kernel, lambda: mod.kernel("axpb"))
    for attempt in refused:
        with pytest.raises(safejit.LoadError):
            attempt()
