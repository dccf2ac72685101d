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
import operator
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ConfigError, KernelNotFoundError, LoadError
from .args import NO_PLAN, encode_argument, make_packer

__all__ = ["CudaKernel", "CudaLibrary", "device_arch", "has_cuda_device", "stream_handle"]

_driver_state: dict[str, Any] = {}
_SUCCESS: list[Any] = [None]  # CUDA_SUCCESS, once the driver is loaded
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
        _SUCCESS[0] = driver.CUresult.CUDA_SUCCESS
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


#: Stream types without ``__cuda_stream__``, and the attribute that holds their handle.
_STREAM_READERS: dict[type, Callable[[Any], Any]] = {}


def stream_handle(stream: Any) -> int:
    """A raw ``CUstream`` from None (torch's current stream when torch is
    imported and initialised, else the default stream), an int, an object with
    ``__cuda_stream__`` (protocol v0) or ``cuda_stream``/``handle``."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            # The raw handle of the current stream: no Stream object per launch.
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            device = getattr(torch._C, "_cuda_getDevice", None)
            if raw is not None and device is not None:
                return int(raw(device()))
            return int(torch.cuda.current_stream().cuda_stream)
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    reader = _STREAM_READERS.get(type(stream))
    if reader is not None:
        try:
            return int(reader(stream))
        except (TypeError, ValueError, AttributeError):
            _STREAM_READERS.pop(type(stream), None)  # not like the first of its type: look again
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        _, raw_handle = proto() if callable(proto) else proto
        handle = int(raw_handle)
        if len(_STREAM_READERS) < 16:
            # Next time: for CuPy's and torch's streams, whose handle attribute is by
            # definition the protocol's handle, that attribute (cheaper than the call).
            same = [a for a in ("ptr", "cuda_stream") if _int_or_none(getattr(stream, a, None)) == handle]
            known = type(stream).__module__.partition(".")[0] in ("cupy", "torch")
            _STREAM_READERS[type(stream)] = operator.attrgetter(same[0]) if same and known else _protocol_handle
        return handle
    for attr in ("cuda_stream", "handle", "ptr"):
        value = getattr(stream, attr, None)
        if value is not None:
            if len(_STREAM_READERS) < 16:  # next time, read just that attribute
                _STREAM_READERS[type(stream)] = operator.attrgetter(attr)
            return int(value)
    raise ConfigError(f"cannot use {type(stream).__name__} as a CUDA stream")


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _protocol_handle(stream: Any) -> Any:
    proto = stream.__cuda_stream__
    return (proto() if callable(proto) else proto)[1]


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
        self._plans: dict[tuple[type, ...], Any] = {}
        self._last: Callable[[memoryview, Any], bool] | None = None
        # A CUkernel launches as a CUfunction in whichever context is current (CUDA >= 12).
        self._fn = _driver().CUfunction(int(kernel)) if kernel is not None else None
        drv = _driver_state.get("driver")
        self._launch_fn: Any = drv.cuLaunchKernel if drv is not None else None
        self._success: Any = _SUCCESS[0]

    @property
    def num_params(self) -> int:
        return len(self._params)

    def pack(self, args: Sequence[Any]) -> int:
        """Write ``args`` into the reusable buffer; returns the ``void**`` address.

        The argument types of a call pick a plan, made once per kernel and type tuple:
        one ``struct`` for the whole layout and, per argument, how to read its value
        (a tensor's pointer, a NumPy scalar's bytes), as one small function. A value
        the plan cannot take (an int out of the signed range, say), or types without a
        plan, go through :func:`_encode`, which also names every mismatch.
        """
        bufs = getattr(self._local, "bufs", None) or self._new_buffers()
        view = bufs[1]
        last = self._last
        if last is not None and last(view, args):
            return bufs[2]
        if len(args) != len(self._params):
            raise ConfigError(f"{self.name} takes {len(self._params)} arguments, got {len(args)}")
        kinds = tuple(map(type, args))
        plan = self._plans.get(kinds, NO_PLAN)
        if plan is NO_PLAN:
            plan = self._plans[kinds] = self._plan(args, kinds) if len(self._plans) < 64 else None
        if plan is not None:
            self._last = plan
            if plan(view, args):
                return bufs[2]
        declared = self._argtypes
        for i, (arg, (offset, size)) in enumerate(zip(args, self._params, strict=True)):
            view[offset : offset + size] = encode_argument(arg, size, declared[i] if declared else None, self.name, i)
        return bufs[2]

    def _new_buffers(self) -> tuple[Any, memoryview, int, Any]:
        """This thread's packed buffer: its storage, a writable view, the ``void**`` address."""
        total = max((o + s for o, s in self._params), default=0)
        storage = (ctypes.c_char * max(total, 1))()
        base = ctypes.addressof(storage)
        ptrs = (ctypes.c_void_p * max(len(self._params), 1))(*[base + o for o, _ in self._params])
        bufs = self._local.bufs = (storage, memoryview(storage).cast("B"), ctypes.addressof(ptrs), ptrs)
        return bufs

    def _plan(self, args: Sequence[Any], kinds: tuple[type, ...]) -> Callable[[memoryview, Any], bool] | None:
        return None if self._argtypes is not None else make_packer(self._params, args, kinds)

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
        try:
            view, params = self._local.fast
        except AttributeError:
            _ensure_context()  # once per thread; the CUkernel then launches in the current context
            bufs = self._new_buffers()
            view, params = self._local.fast = (bufs[1], bufs[2])
        packer = self._last
        if packer is None or not packer(view, args):
            self.pack(args)
        if stream is None or type(stream) is int:
            handle = stream_handle(stream)
        else:
            try:
                handle = _STREAM_READERS[type(stream)](stream)
                if type(handle) is not int:
                    handle = int(handle)
            except (KeyError, TypeError, ValueError, AttributeError):
                handle = stream_handle(stream)
        try:
            gx, gy, gz, bx, by, bz = self._dims[grid, block]
        except (KeyError, TypeError):
            gx, gy, gz, bx, by, bz = dims = (*_dim3(grid), *_dim3(block))
            if type(grid) is tuple and type(block) is tuple and len(self._dims) < 64:
                self._dims[grid, block] = dims
        fn = self._fn
        if cluster is None and not cooperative:
            (err,) = self._launch_fn(fn, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0)
            if err != self._success:
                _check((err,), "cuLaunchKernel")
            return
        drv = _driver_state["driver"]
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
            view[offset : offset + size] = encode_argument(
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
