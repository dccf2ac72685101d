"""Loading cubins and launching CUDA kernels from Python.

A :class:`CudaLibrary` holds the verified cubin bytes and loads them with
``cuLibraryLoadData`` on first use (so a cache hit touches no GPU until a
kernel is needed); it is unloaded by ``close()`` or its finalizer. Arguments
are packed by the kernel's parameter layout, read from the cubin: a Python
``int``/``float`` takes exactly the parameter's width — never a silent width
mismatch — and the packed buffers are reused between launches.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError, KernelNotFoundError, LoadError

__all__ = ["CudaKernel", "CudaLibrary", "device_arch", "has_cuda_device", "stream_handle"]

_driver_state: dict[str, Any] = {}
_driver_lock = threading.Lock()


def _driver() -> Any:
    """``cuda.bindings.driver`` after a successful ``cuInit``; raises LoadError without a driver."""
    with _driver_lock:
        if "driver" in _driver_state:
            return _driver_state["driver"]
        if "error" in _driver_state:
            raise LoadError(_driver_state["error"])
        try:
            from cuda.bindings import driver

            (err,) = driver.cuInit(0)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuInit failed: {err}")
            err, count = driver.cuDeviceGetCount()
            if err != driver.CUresult.CUDA_SUCCESS or count < 1:
                raise RuntimeError("no CUDA device")
        except Exception as exc:
            _driver_state["error"] = f"no usable CUDA driver/device: {type(exc).__name__}: {exc}"
            raise LoadError(_driver_state["error"]) from exc
        _driver_state["driver"] = driver
        return driver


def has_cuda_device() -> bool:
    """Probe the driver (cheaply, once); never touches cuda.core load paths."""
    try:
        _driver()
    except LoadError:
        return False
    return True


def _check(result: Any, what: str) -> Any:
    drv = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise LoadError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def _ensure_context() -> Any:
    """The current context, or the primary context of device 0 made current
    (the one PyTorch and CuPy use)."""
    drv = _driver()
    ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        dev = _check(drv.cuDeviceGet(0), "cuDeviceGet")
        ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def device_arch() -> str | None:
    """``sm_XY`` of the current (or first) device; None when there is none."""
    if not has_cuda_device():
        return None
    drv = _driver()
    _ensure_context()
    dev = _check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = drv.CUdevice_attribute
    major = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
    minor = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
    return f"sm_{major}{minor}"


def stream_handle(stream: Any) -> int:
    """A raw ``CUstream`` from None (torch's current stream when torch is
    imported and initialised, else the default stream), an int, an object with
    ``__cuda_stream__`` (protocol v0) or ``cuda_stream``/``handle``."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object per launch
            if raw is not None:
                return int(raw(torch.cuda.current_device()))
            return int(torch.cuda.current_stream().cuda_stream)
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        _, handle = proto() if callable(proto) else proto
        return int(handle)
    for attr in ("cuda_stream", "handle", "ptr"):
        value = getattr(stream, attr, None)
        if value is not None:
            return int(value)
    raise ConfigError(f"cannot use {type(stream).__name__} as a CUDA stream")


class CudaLibrary:
    """A cubin, loaded into the driver on first use."""

    def __init__(
        self, cubin: bytes, name: str, params: Mapping[str, list[list[int]]], symbols: Mapping[str, str]
    ) -> None:
        self._cubin = cubin
        self._name = name
        self._params = {k: [(int(o), int(s)) for o, s in v] for k, v in params.items()}
        self._symbols = dict(symbols)
        self._lib: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._kernels: dict[tuple[str, Any], CudaKernel] = {}

    def _library(self) -> Any:
        with self._lock:
            if self._closed:
                raise LoadError(f"{self._name}: library is closed")
            if self._lib is None:
                drv = _driver()
                _ensure_context()
                self._lib = _check(drv.cuLibraryLoadData(self._cubin, [], [], 0, [], [], 0), "cuLibraryLoadData")
            return self._lib

    def function(self, name: str, **options: Any) -> CudaKernel:
        argtypes = options.get("argtypes")
        cache_key = (name, tuple(argtypes) if argtypes is not None else None)
        found = self._kernels.get(cache_key)
        if found is not None and not self._closed:
            return found  # re-getting a kernel is a dict lookup
        lowered = self._symbols.get(name, name)
        if lowered not in self._params:
            raise KernelNotFoundError(f"no kernel {name!r}; this module has {sorted(self._params)}", name=name)
        lib = self._library()
        kern = _check(_driver().cuLibraryGetKernel(lib, lowered.encode()), "cuLibraryGetKernel")
        kernel = CudaKernel(name, kern, self._params[lowered], argtypes)
        self._kernels[cache_key] = kernel
        return kernel

    def close(self) -> None:
        with self._lock:
            lib, self._lib, self._closed = self._lib, None, True
            self._kernels.clear()
        if lib is not None and "driver" in _driver_state:
            _driver_state["driver"].cuLibraryUnload(lib)


_INT = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT = {2: "e", 4: "f", 8: "d"}
_INT_PACK = {size: struct.Struct("<" + fmt) for size, fmt in _INT.items()}
_FLOAT_PACK = {size: struct.Struct("<" + fmt) for size, fmt in _FLOAT.items()}


class CudaKernel:
    """``launch(grid, block, args, *, shared_mem=0, stream=None, cluster=None, cooperative=False)``."""

    def __init__(
        self, name: str, kernel: Any, params: Sequence[tuple[int, int]], argtypes: Sequence[Any] | None
    ) -> None:
        self.name = name
        self._kernel = kernel
        self._params = list(params)
        self._argtypes = list(argtypes) if argtypes is not None else None
        if self._argtypes is not None and len(self._argtypes) != len(self._params):
            raise ConfigError(f"{name}: {len(self._argtypes)} argtypes for {len(self._params)} parameters")
        # One reusable packed buffer and void* array per thread.
        self._local = threading.local()
        self._dims: dict[tuple[Any, Any], tuple[int, int, int, int, int, int]] = {}
        # A CUkernel launches as a CUfunction in whichever context is current (CUDA >= 12).
        self._fn = _driver().CUfunction(int(kernel)) if kernel is not None else None

    @property
    def num_params(self) -> int:
        return len(self._params)

    def _buffers(self) -> tuple[Any, memoryview, int]:
        """This thread's packed buffer: its storage, a writable view and the ``void**`` address."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            total = max((o + s for o, s in self._params), default=0)
            storage = (ctypes.c_char * max(total, 1))()
            base = ctypes.addressof(storage)
            ptrs = (ctypes.c_void_p * max(len(self._params), 1))(*[base + o for o, _ in self._params])
            bufs = self._local.bufs = (storage, memoryview(storage).cast("B"), ctypes.addressof(ptrs), ptrs)
        return bufs[0], bufs[1], bufs[2]

    def pack(self, args: Sequence[Any]) -> int:
        """Write ``args`` into the reusable buffer; returns the ``void**`` address.

        Python ints and floats take a fast path (one ``struct.pack_into`` at the
        parameter's width); everything else goes through :func:`_encode`.
        """
        params = self._params
        if len(args) != len(params):
            raise ConfigError(f"{self.name} takes {len(params)} arguments, got {len(args)}")
        _, view, address = self._buffers()
        declared = self._argtypes
        for i, arg in enumerate(args):
            offset, size = params[i]
            kind = type(arg)
            if declared is None and (kind is int or kind is float):
                packer = (_INT_PACK if kind is int else _FLOAT_PACK).get(size)
                if packer is not None:
                    try:
                        packer.pack_into(view, offset, arg)
                        continue
                    except (struct.error, OverflowError):
                        pass  # out of range for the signed form: _encode decides
            view[offset : offset + size] = _encode(arg, size, declared[i] if declared else None, self.name, i)
        return address

    def launch(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any] = (),
        *,
        shared_mem: int = 0,
        stream: Any = None,
        cluster: Any = None,
        cooperative: bool = False,
    ) -> None:
        drv = _driver_state.get("driver") or _driver()
        if not getattr(self._local, "context", False):
            _ensure_context()  # once per thread; the CUkernel then launches in the current context
            self._local.context = True
        dims = self._dims.get((grid, block)) if type(grid) is tuple and type(block) is tuple else None
        if dims is None:
            dims = (*_dim3(grid), *_dim3(block))
            if type(grid) is tuple and type(block) is tuple and len(self._dims) < 64:
                self._dims[(grid, block)] = dims
        gx, gy, gz, bx, by, bz = dims
        params = self.pack(args)
        handle = stream_handle(stream)
        fn = self._fn
        if cluster is None and not cooperative:
            _check(drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0), "cuLaunchKernel")
            return
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
        config.sharedMemBytes = shared_mem
        config.hStream = drv.CUstream(handle)
        attrs = []
        if cluster is not None:
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = _dim3(cluster)
            attrs.append(attr)
        if cooperative:
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attr.value.cooperative = 1
            attrs.append(attr)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        _check(drv.cuLaunchKernelEx(config, fn, params, 0), "cuLaunchKernelEx")

    def prepare(
        self, grid: Any, block: Any, args: Sequence[Any] = (), *, shared_mem: int = 0, stream: Any = None
    ) -> PreparedLaunch:
        """A launch with its arguments packed once, into a buffer of its own: calling it
        costs one ``cuLaunchKernel``. The stream is resolved now (pass it explicitly if
        it will change); repack with a new ``prepare`` when the arguments change."""
        drv = _driver_state.get("driver") or _driver()
        _ensure_context()
        total = max((o + s for o, s in self._params), default=0)
        storage = (ctypes.c_char * max(total, 1))()
        base = ctypes.addressof(storage)
        view = memoryview(storage).cast("B")
        if len(args) != len(self._params):
            raise ConfigError(f"{self.name} takes {len(self._params)} arguments, got {len(args)}")
        for i, (arg, (offset, size)) in enumerate(zip(args, self._params, strict=True)):
            view[offset : offset + size] = _encode(
                arg, size, self._argtypes[i] if self._argtypes else None, self.name, i
            )
        ptrs = (ctypes.c_void_p * max(len(self._params), 1))(*[base + o for o, _ in self._params])
        return PreparedLaunch(
            drv,
            self._fn,
            (*_dim3(grid), *_dim3(block)),
            shared_mem,
            stream_handle(stream),
            (storage, ptrs, tuple(args)),
        )

    def __call__(self, *args: Any) -> Any:
        raise LoadError(f"{self.name} is a CUDA kernel: use .launch(grid, block, args)")


class PreparedLaunch:
    """A packed launch; ``p()`` enqueues it again. Keeps its arguments alive."""

    __slots__ = ("_call", "_keep")

    def __init__(
        self,
        drv: Any,
        fn: Any,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        keep: tuple[Any, Any, tuple[Any, ...]],
    ) -> None:
        launch, success = drv.cuLaunchKernel, drv.CUresult.CUDA_SUCCESS
        gx, gy, gz, bx, by, bz = dims
        params = ctypes.addressof(keep[1])
        self._keep = keep

        def call() -> None:
            (err,) = launch(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)
            if err != success:
                raise LoadError(f"cuLaunchKernel failed: {err}")

        self._call = call

    def __call__(self) -> None:
        self._call()


def _dim3(value: Any) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"a grid/block/cluster dimension must be 1-3 positive ints, got {value!r}")
    full = (*dims, 1, 1)
    return (full[0], full[1], full[2])


def _encode(arg: Any, size: int, declared: Any, kernel: str, index: int) -> bytes:
    """The bytes of one argument for a parameter of ``size`` bytes."""
    where = f"{kernel} argument {index}"
    if declared is not None:
        value = declared(arg) if not isinstance(arg, declared) else arg
        if ctypes.sizeof(value) != size:
            raise ConfigError(
                f"{where}: declared {declared.__name__} is {ctypes.sizeof(value)} bytes, the kernel takes {size}"
            )
        return bytes(value)
    ptr = _pointer(arg)
    if ptr is not None:
        if size != 8:
            raise ConfigError(f"{where}: a device pointer is 8 bytes, the parameter is {size}")
        return struct.pack("<Q", ptr)
    if isinstance(arg, ctypes._SimpleCData):
        if ctypes.sizeof(arg) != size:
            raise ConfigError(f"{where}: {type(arg).__name__} is {ctypes.sizeof(arg)} bytes, the kernel takes {size}")
        return bytes(arg)
    itemsize = getattr(arg, "itemsize", None)
    if itemsize is not None and hasattr(arg, "tobytes") and getattr(arg, "ndim", 0) == 0:  # NumPy scalar
        if itemsize != size:
            raise ConfigError(f"{where}: {arg.dtype} is {itemsize} bytes, the kernel takes {size}")
        return bytes(arg.tobytes())
    if isinstance(arg, bool):
        return int(arg).to_bytes(size, "little")
    if isinstance(arg, int):
        fmt = _INT.get(size)
        if fmt is None:
            raise ConfigError(f"{where}: an int cannot fill a {size}-byte parameter")
        try:
            return struct.pack("<" + fmt, arg)
        except struct.error:
            if arg >= 0:
                try:
                    return struct.pack("<" + fmt.upper(), arg)
                except struct.error:
                    pass
            raise ConfigError(f"{where}: {arg} does not fit {size} bytes") from None
    if isinstance(arg, float):
        fmt = _FLOAT.get(size)
        if fmt is None:
            raise ConfigError(f"{where}: a float cannot fill a {size}-byte parameter")
        return struct.pack("<" + fmt, arg)
    raise ConfigError(f"{where}: cannot pass a {type(arg).__name__}")


def _pointer(arg: Any) -> int | None:
    data_ptr = getattr(arg, "data_ptr", None)
    if callable(data_ptr):  # torch.Tensor
        return int(data_ptr())
    ptr = getattr(getattr(arg, "data", None), "ptr", None)  # CuPy: cheaper than building the interface dict
    if isinstance(ptr, int) and hasattr(type(arg), "__cuda_array_interface__"):  # the class: no dict built
        return ptr
    iface = getattr(arg, "__cuda_array_interface__", None)
    if isinstance(iface, dict):
        return int(iface["data"][0])
    return None
