"""CUDA loading and launching without a GPU: child processes whose ``libcuda.so.1`` is
a fake driver (``tests/fakecuda/libcuda.c``) that records what it is handed. The C
launch path must hand the driver the bytes the Python path packs (the cubin's
widths), raise the same typed errors, read streams the same way, load lazily and
unload on close."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import safejit
from safejit.backends.cuda.cubin import cubin_kernels

pytest.importorskip("cuda.bindings.nvrtc")
pytest.importorskip("cuda.core")
CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler for the fake driver")
FAKE_DIR = Path(__file__).resolve().parents[3] / "fakecuda"

KERNELS = """
extern "C" __global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
extern "C" __global__ void mixed(double d, char c, short s, long long q, unsigned u, float f, void* p) {}
"""

PRELUDE = """
import json, sys
sys.path.insert(0, {fake_dir!r})
from child import counts, last_launch, set_layout
import numpy as np
import safejit
from safejit.backends.cuda.args import encode_argument
KERNELS = {kernels!r}
rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=({cache!r},)))
mod = rt.compile(safejit.Source(KERNELS, "kernels"))
out = {{}}
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The fake driver built, and a cache holding the kernels' cubin for sm_90 (what the
    fake device says it is)."""
    base = tmp_path_factory.mktemp("fakecuda")
    lib = base / "lib"
    lib.mkdir()
    subprocess.run(
        [CC, "-O2", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(FAKE_DIR / "libcuda.c")], check=True
    )
    cache = base / "cache"
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(str(cache),)))
    try:
        art = rt.build(safejit.Source(KERNELS, "kernels"), arch="sm_90")
    finally:
        rt.close()
    layouts = cubin_kernels((Path(art.path) / "artifact.cubin").read_bytes())
    return {"lib": str(lib), "cache": str(cache), "layouts": json.dumps(layouts)}


def run_child(fake_driver: dict[str, str], body: str) -> dict:
    script = PRELUDE.format(fake_dir=str(FAKE_DIR), cache=fake_driver["cache"], kernels=KERNELS)
    script += textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env["LD_LIBRARY_PATH"] = fake_driver["lib"]
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_layouts_are_the_cubins(fake_driver):
    layouts = json.loads(fake_driver["layouts"])
    assert layouts["scale"] == [[0, 8], [8, 4], [12, 4]]
    assert [size for _, size in layouts["mixed"]] == [8, 1, 2, 8, 4, 4, 8]


def test_c_path_packs_the_bytes_the_python_path_packs(fake_driver):
    out = run_child(
        fake_driver,
        """
        import ctypes
        class Tensor:  # torch's way: data_ptr()
            def data_ptr(self): return 0xDEADBEEF00
        class Buffer:  # CuPy's way: .data.ptr, with the interface on the class
            __cuda_array_interface__ = {"data": (0x1234500, False), "shape": (1,), "typestr": "<f4", "version": 3}
            class data: ptr = 0x1234500
        k = mod.kernel("mixed")
        sizes = [8, 1, 2, 8, 4, 4, 8]
        set_layout(sizes)
        calls = [
            (1.5, -3, 300, -(2**63), 2**32 - 1, 2.5, 0x7F00),
            (0.25, 127, -32768, 2**64 - 1, 7, -1.0, Tensor()),
            (np.float64(2.0), np.int8(-1), np.int16(9), np.int64(-9), np.uint32(5), np.float32(0.5), Buffer()),
            (ctypes.c_double(3.0), ctypes.c_byte(1), ctypes.c_short(2), ctypes.c_longlong(3), ctypes.c_uint(4),
             ctypes.c_float(5.0), ctypes.c_void_p(6)),
        ]
        out["runs"] = []
        for args in calls:
            expected = [encode_argument(a, s, None, "mixed", i).hex() for i, (a, s) in enumerate(zip(args, sizes))]
            seen = []
            for _ in range(3):  # the first call teaches the C path; the next ones take it
                k.launch((2, 3), 64, args)
                seen.append(last_launch())
            k.launch_python((2, 3), 64, list(args))
            seen.append(last_launch())
            out["runs"].append({"expected": expected, "seen": seen})
        out["builtin"] = type(k.launch).__name__
        """,
    )
    assert out["builtin"] == "builtin_function_or_method"
    for run in out["runs"]:
        entries = [s["entry"] for s in run["seen"]]
        assert entries == ["cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernel"]
        for seen in run["seen"]:
            assert seen["params"] == run["expected"]
            assert (seen["grid"], seen["block"]) == ([2, 3, 1], [64, 1, 1])


def test_c_path_width_mismatches_are_typed_errors_and_launch_nothing(fake_driver):
    out = run_child(
        fake_driver,
        """
        k = mod.kernel("scale")
        set_layout([8, 4, 4])
        k.launch(1, 32, (0x7F00, 1.0, 5))
        k.launch(1, 32, (0x7F00, 1.0, 6))  # the C path from here on
        before = counts()["launches"]
        out["errors"] = []
        for args in [(0x7F00, 1.0, 2**40), (0x7F00, 1.0, -(2**31) - 1), (0x7F00, 1e39, 1), (0x7F00, 1.0),
                     (0x7F00, "1.0", 1), (np.int32(1), 1.0, 1), (0x7F00, np.float64(1.0), 1)]:
            try:
                k.launch(1, 32, args)
                out["errors"].append(None)
            except Exception as exc:
                out["errors"].append(type(exc).__name__)
        out["launched"] = counts()["launches"] - before
        k.launch(1, 32, (0x7F00, 1.0, 2**32 - 1))  # fits the unsigned int of that width
        out["unsigned"] = last_launch()
        """,
    )
    assert out["errors"] == [
        "ConfigError",
        "ConfigError",
        "OverflowError",  # struct.pack("<f", 1e39), as on the Python path
        "ConfigError",
        "ConfigError",
        "ConfigError",
        "ConfigError",
    ]
    assert out["launched"] == 0
    assert out["unsigned"]["params"][2] == "ffffffff" and out["unsigned"]["entry"] == "cuLaunchKernelEx"


def test_c_path_reads_each_kind_of_stream(fake_driver):
    out = run_child(
        fake_driver,
        """
        from cuda.core import Device
        class Proto:
            def __cuda_stream__(self): return (0, 4242)
        class Attr:
            cuda_stream = 77
        device = Device(0)
        device.set_current()
        core = device.create_stream()
        k = mod.kernel("scale")
        set_layout([8, 4, 4])
        out["streams"] = {}
        for name, stream in [("none", None), ("int", 99), ("proto", Proto()), ("attr", Attr()), ("core", core)]:
            seen = []
            for _ in range(3):
                k.launch(1, 32, (0x7F00, 1.0, 5), stream=stream)
                seen.append((last_launch()["stream"], last_launch()["entry"]))
            out["streams"][name] = seen
        out["core_handle"] = int(core.handle)
        """,
    )
    expected = {"none": 0, "int": 99, "proto": 4242, "attr": 77, "core": out["core_handle"]}
    for name, seen in out["streams"].items():
        assert [handle for handle, _ in seen] == [expected[name]] * 3, name
        assert seen[-1][1] == "cuLaunchKernelEx", name


def test_c_path_dimensions_and_shared_memory(fake_driver):
    out = run_child(
        fake_driver,
        """
        k = mod.kernel("scale")
        set_layout([8, 4, 4])
        k.launch(1, 1, (0, 1.0, 1))
        out["seen"] = []
        for grid, block, shared in [((4, 5, 6), (32, 2), 0), (7, 128, 4096), ([3, 2], [16], 8)]:
            k.launch(grid, block, (0, 1.0, 1), shared_mem=shared)
            seen = last_launch()
            out["seen"].append([seen["grid"], seen["block"], seen["shared_mem"], seen["entry"]])
        out["errors"] = []
        for grid in [0, (1, 2, 3, 4), (1, -1), 2.0]:
            try:
                k.launch(grid, 32, (0, 1.0, 1))
                out["errors"].append(None)
            except Exception as exc:
                out["errors"].append(type(exc).__name__)
        """,
    )
    assert out["seen"] == [
        [[4, 5, 6], [32, 2, 1], 0, "cuLaunchKernelEx"],
        [[7, 1, 1], [128, 1, 1], 4096, "cuLaunchKernelEx"],
        [[3, 2, 1], [16, 1, 1], 8, "cuLaunchKernel"],  # lists: the Python path takes them
    ]
    assert out["errors"] == ["ConfigError"] * 4


def test_load_is_lazy_and_close_unloads_and_kernels_refuse_afterwards(fake_driver):
    out = run_child(
        fake_driver,
        """
        import gc
        out["after_compile"] = counts()
        k = mod.kernel("scale")
        out["after_kernel"] = counts()
        k.launch(1, 32, (0, 1.0, 1)); k.launch(1, 32, (0, 1.0, 1))
        prepared = k.prepare(1, 32, (0, 1.0, 1))
        mod.close()
        mod.close()
        out["after_close"] = counts()
        out["refused"] = []
        for attempt in (lambda: k.launch(1, 32, (0, 1.0, 1)), lambda: k.launch_python(1, 32, (0, 1.0, 1)),
                        prepared, lambda: k.cuda_core_kernel, lambda: k.handle, lambda: mod.kernel("scale")):
            try:
                attempt()
                out["refused"].append(None)
            except safejit.LoadError:
                out["refused"].append("LoadError")
        out["after_refusals"] = counts()
        """,
    )
    assert out["after_compile"] == {"loads": 0, "unloads": 0, "launches": 0}
    assert out["after_kernel"] == {"loads": 1, "unloads": 0, "launches": 0}
    assert out["after_close"] == {"loads": 1, "unloads": 1, "launches": 2}
    assert out["refused"] == ["LoadError"] * 6
    assert out["after_refusals"] == out["after_close"]


def test_an_unreferenced_module_is_unloaded_by_its_finalizer(fake_driver):
    out = run_child(
        fake_driver,
        """
        import gc
        k = mod.kernel("scale")
        k.launch(1, 32, (0, 1.0, 1))
        out["loaded"] = counts()
        del k, mod
        rt.close()
        del rt
        gc.collect()
        out["collected"] = counts()
        """,
    )
    assert out["loaded"]["loads"] == 1
    assert out["collected"]["unloads"] == 1


def test_cuda_core_kernel_is_this_kernel_for_cuda_core_launch(fake_driver):
    out = run_child(
        fake_driver,
        """
        from cuda.core import Device, LaunchConfig, launch
        device = Device(0)
        device.set_current()
        k = mod.kernel("scale")
        core = k.cuda_core_kernel
        set_layout([8, 4, 4])
        launch(device.create_stream(), LaunchConfig(grid=3, block=32), core, 0x7F00, np.float32(2.0), np.int32(9))
        out["seen"] = last_launch()
        out["handle"] = k.handle
        out["same"] = k.cuda_core_kernel is core
        """,
    )
    assert out["seen"]["function"] == out["handle"] and out["same"]
    assert out["seen"]["params"] == ["007f000000000000", "00000040", "09000000"]


def test_a_refused_launch_is_a_load_error_on_either_path(fake_driver):
    out = run_child(
        fake_driver,
        """
        k = mod.kernel("scale")
        k.launch(1, 32, (0, 1.0, 1))
        out["errors"] = []
        for launch in (k.launch, k.launch_python):
            try:
                launch(77777, 32, (0, 1.0, 1))  # the fake refuses this grid
            except safejit.LoadError as exc:
                out["errors"].append(str(exc))
        """,
    )
    assert len(out["errors"]) == 2
    assert "cuLaunchKernelEx failed" in out["errors"][0] and "cuLaunchKernel failed" in out["errors"][1]


def test_without_the_c_path_launches_take_the_python_path(fake_driver):
    out = run_child(
        fake_driver,
        """
        from safejit.sandbox import extensions
        extensions.load = lambda *args: None  # no compiler, no Python.h: before the first kernel
        k = mod.kernel("scale")
        set_layout([8, 4, 4])
        for _ in range(3):
            k.launch((2,), (32,), (0x7F00, 0.5, 3))
        out["seen"] = last_launch()
        out["kind"] = type(k.launch).__name__
        """,
    )
    assert out["kind"] == "method"
    assert out["seen"]["entry"] == "cuLaunchKernel"
    assert out["seen"]["params"] == ["007f000000000000", "0000003f", "03000000"]


def test_a_later_ndarray_is_never_packed_by_an_earlier_0d_arrays_plan():
    """A 0-d ndarray planned a '{size}s' packing checked by type alone: any later ndarray
    passed (a host array for a pointer, an int64 for a 4-byte int), truncated or padded
    into the parameter's bytes. NumPy scalars (whose type fixes the dtype) keep the plan."""
    import struct

    np = pytest.importorskip("numpy")
    from safejit.backends.cuda.args import encode_argument
    from safejit.backends.cuda.launch import CudaKernel

    k = CudaKernel("k", None, [(0, 8), (8, 4)], None)
    k.pack((np.array(0x7F0000001000, dtype=np.uint64), np.array(16, dtype=np.int32)))
    with pytest.raises(safejit.ConfigError):
        k.pack((np.array([1.5, 2.5]), np.array(2**40 + 7, dtype=np.int64)))
    k.pack((np.uint64(0x7F0000002000), np.int32(5)))
    assert struct.unpack_from("<Qi", bytes(k._local.bufs[0])) == (0x7F0000002000, 5)
    masked = CudaKernel("k", None, [(0, 8), (8, 4)], None)  # (an ndarray subclass: no plan either)
    masked.pack((np.ma.masked_array(np.uint64(0x7F0000001000)), np.int32(1)))
    with pytest.raises(safejit.ConfigError):
        masked.pack((np.ma.masked_array([1.5, 2.5]), np.int32(1)))
    assert encode_argument(np.array(1.5, np.float32), 4, None, "k", 0) == struct.pack("<f", 1.5)


def test_a_declared_argument_that_does_not_fit_is_refused():
    """With argtypes declared, ctypes wrapped an int that does not fit (2**40+7 as c_int32
    is 7, -1 as c_uint32 is 0xffffffff); undeclared, the same value was refused."""
    import ctypes

    from safejit.backends.cuda.args import encode_argument

    for value, declared in ((2**40 + 7, ctypes.c_int32), (-1, ctypes.c_uint32)):
        with pytest.raises(safejit.ConfigError, match="does not fit"):
            encode_argument(value, 4, declared, "k", 0)
    assert encode_argument(7, 4, ctypes.c_int32, "k", 0) == (7).to_bytes(4, "little")
    assert encode_argument(0, 8, ctypes.c_void_p, "k", 0) == bytes(8)  # (NULL: its value reads None)
    assert encode_argument(65, 1, ctypes.c_char, "k", 0) == b"A"
