"""Loading cubins and launching CUDA kernels from Python.

A :class:`CudaLibrary` holds the verified cubin bytes and loads them with
``cuLibraryLoadData`` on first use (so a cache hit touches no GPU until a kernel is
needed); ``close()`` or its finalizer unloads it (``cuLibraryUnload``), and its
kernels refuse to launch from then on. Arguments are packed by the kernel's
parameter layout, read from the cubin: a Python ``int``/``float`` takes exactly the
parameter's width — never a silent width mismatch.

A kernel's ``launch`` is the C launch path (``fastpath``) where it could be built,
else the Python path below; the C path takes only what it packs exactly as the
Python path does and hands everything else to it, so bytes and errors are the
same either way. For interop, :attr:`CudaKernel.cuda_core_kernel` is the kernel as
a ``cuda.core.Kernel`` (valid while its module is open).

Why safejit loads the cubin itself rather than through ``cuda.core.ObjectCode``:
cuda.core 1.2 never unloads a library (its ``cuLibraryUnload`` is commented out
until it tracks the owning context), and a rebuilt kernel must not leak the old one.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ConfigError, KernelNotFoundError, LoadError
from . import driver
from .args import NO_PLAN, encode_argument, make_packer, native_plan
from .driver import device_arch, has_cuda_device
from .streams import READERS, read_stream, stream_handle

__all__ = ["CudaKernel", "CudaLibrary", "PreparedLaunch", "device_arch", "has_cuda_device", "stream_handle"]


class CudaLibrary:
    """A cubin, loaded into the driver on first use. ``fast`` gives the C launch path
    (or None) when the first kernel is made."""

    def __init__(
        self,
        cubin: bytes,
        name: str,
        params: Mapping[str, list[list[int]]],
        symbols: Mapping[str, str],
        fast: Callable[[], Any] | None = None,
    ) -> None:
        self._cubin = cubin
        self._name = name
        self._params = {k: [(int(o), int(s)) for o, s in v] for k, v in params.items()}
        self._symbols = dict(symbols)
        self._fast = fast
        self._lib: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._kernels: dict[tuple[str, Any], CudaKernel] = {}

    def _library(self) -> Any:
        with self._lock:
            if self._closed:
                raise LoadError(f"{self._name}: library is closed")
            if self._lib is None:
                drv = driver.driver()
                driver.ensure_context()
                self._lib = driver.check(drv.cuLibraryLoadData(self._cubin, [], [], 0, [], [], 0), "cuLibraryLoadData")
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
        kern = driver.check(driver.driver().cuLibraryGetKernel(lib, lowered.encode()), "cuLibraryGetKernel")
        fast = self._fast() if self._fast is not None and argtypes is None else None
        kernel = CudaKernel(name, kern, self._params[lowered], argtypes, fast=fast)
        with self._lock:
            if self._closed:  # closed while it was made: it never launches
                kernel._close()
                raise LoadError(f"{self._name}: library is closed")
            self._kernels[cache_key] = kernel
        return kernel

    def close(self) -> None:
        """Unload the cubin; its kernels raise LoadError from now on. Safe to call twice."""
        with self._lock:
            lib, self._lib, self._closed = self._lib, None, True
            kernels, self._kernels = list(self._kernels.values()), {}
        for kernel in kernels:
            kernel._close()
        if lib is not None:
            driver.unload(lib)


class CudaKernel:
    """A kernel of a loaded cubin:
    ``launch(grid, block, args=(), *, shared_mem=0, stream=None, cluster=None, cooperative=False)``.

    ``grid``/``block``/``cluster`` are 1-3 positive ints (or one int); ``stream`` is
    None (torch's current stream when torch is in use, else the default stream), a
    raw handle, or a torch/CuPy/cuda.core stream or any ``__cuda_stream__`` object.
    """

    #: The launch function: the C launch path bound to this kernel, or :meth:`launch_python`.
    launch: Callable[..., None]

    def __init__(
        self,
        name: str,
        kernel: Any,
        params: Sequence[tuple[int, int]],
        argtypes: Sequence[Any] | None,
        *,
        fast: Any = None,
    ) -> None:
        self.name = name
        self._kernel = kernel
        self._params = list(params)
        self._argtypes = list(argtypes) if argtypes is not None else None
        if self._argtypes is not None and len(self._argtypes) != len(self._params):
            raise ConfigError(f"{name}: {len(self._argtypes)} argtypes for {len(self._params)} parameters")
        self._closed = False
        # One reusable packed buffer and void* array per thread.
        self._local = threading.local()
        self._dims: dict[tuple[Any, Any], tuple[int, int, int, int, int, int]] = {}
        self._plans: dict[tuple[type, ...], Any] = {}
        self._last: Callable[[memoryview, Any], bool] | None = None
        # A CUkernel launches as a CUfunction in whichever context is current (CUDA >= 12).
        drv = driver.loaded()
        self._fn = drv.CUfunction(int(kernel)) if kernel is not None and drv is not None else None
        self._launch_fn: Any = drv.cuLaunchKernel if drv is not None else None
        self._success: Any = drv.CUresult.CUDA_SUCCESS if drv is not None else None
        self._core: Any = None
        self._fast: Any = None
        self._fast_state: Any = None
        self._fast_types: tuple[type, ...] | None = None
        self.launch = self.launch_python
        if fast is not None and kernel is not None and self._argtypes is None:
            try:
                self._fast_state = fast.new_state(int(kernel), tuple(self._params))
            except (ValueError, OverflowError):
                return  # a layout the C path does not take (over 128 parameters or 4 KiB)
            self._fast = fast
            self.launch = fast.launcher(self._fast_state, self.launch_python)

    @property
    def num_params(self) -> int:
        return len(self._params)

    @property
    def handle(self) -> int:
        """The ``CUkernel``, as an int (valid while the module is open)."""
        self._check_open()
        return int(self._kernel)

    @property
    def cuda_core_kernel(self) -> Any:
        """This kernel as a ``cuda.core.Kernel``, for ``cuda.core.launch`` and its
        occupancy and attribute queries. It does not own the cubin: it is valid while
        this kernel's module is open. (cuda.core packs by Python type — an ``int`` as 8
        bytes — so pass it NumPy scalars of each parameter's width.)"""
        self._check_open()
        if self._core is None:
            from cuda.core import Kernel

            self._core = Kernel.from_handle(int(self._kernel))
        return self._core

    def _check_open(self) -> None:
        if self._closed:
            raise LoadError(f"kernel {self.name}: its module is closed")

    def _close(self) -> None:
        self._closed = True
        self._core = None
        if self._fast is not None:
            self._fast.close(self._fast_state)

    def pack(self, args: Sequence[Any]) -> int:
        """Write ``args`` into this thread's reusable buffer; returns the ``void**`` address.

        The argument types of a call pick a plan, made once per kernel and type tuple:
        one ``struct`` for the whole layout and, per argument, how to read its value
        (a tensor's pointer, a NumPy scalar's bytes), as one small function. A value
        the plan cannot take (an int out of the signed range, say), or types without a
        plan, go through :func:`encode_argument`, which also names every mismatch.
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

    def launch_python(
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
        """The Python launch path: the reference the C path follows, and where it hands
        what it does not take. A call it completes teaches the C path its argument types."""
        if self._closed:
            raise LoadError(f"kernel {self.name}: its module is closed")
        try:
            view, params = self._local.fast
        except AttributeError:
            driver.ensure_context()  # once per thread; the CUkernel then launches in the current context
            bufs = self._new_buffers()
            view, params = self._local.fast = (bufs[1], bufs[2])
        packer = self._last
        if packer is None or not packer(view, args):
            self.pack(args)
        handle = self._stream(stream)
        try:
            gx, gy, gz, bx, by, bz = self._dims[grid, block]
        except (KeyError, TypeError):
            gx, gy, gz, bx, by, bz = dims = (*_dim3(grid), *_dim3(block))
            if type(grid) is tuple and type(block) is tuple and len(self._dims) < 64:
                self._dims[grid, block] = dims
        if cluster is not None or cooperative:
            self._launch_ex((gx, gy, gz, bx, by, bz), shared_mem, handle, params, cluster, cooperative)
            return
        (err,) = self._launch_fn(self._fn, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0)
        if err != self._success:
            driver.check((err,), "cuLaunchKernel")
        if self._fast is not None:
            self._teach_fast(args)

    def _stream(self, stream: Any) -> int:
        if stream is None or type(stream) is int:
            return stream_handle(stream)
        how = READERS.get(type(stream), stream_handle)
        if how is stream_handle:
            return stream_handle(stream)
        try:
            return read_stream(stream, how)  # type: ignore[arg-type]
        except (TypeError, ValueError, AttributeError, IndexError):
            return stream_handle(stream)

    def _teach_fast(self, args: Sequence[Any]) -> None:
        """Give the C path the plan for these argument types (once per change of types)."""
        kinds = tuple(map(type, args))
        if kinds == self._fast_types:
            return
        plan = native_plan(self._params, args)
        if plan is not None:
            self._fast.set_plan(self._fast_state, *plan)
            self._fast_types = kinds

    def _launch_ex(
        self, dims: tuple[int, ...], shared_mem: int, handle: int, params: int, cluster: Any, cooperative: bool
    ) -> None:
        """A launch with attributes (a cluster shape, cooperative), through ``cuLaunchKernelEx``."""
        drv = driver.driver()
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ = dims
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
        driver.check(drv.cuLaunchKernelEx(config, self._fn, params, 0), "cuLaunchKernelEx")

    def prepare(
        self, grid: Any, block: Any, args: Sequence[Any] = (), *, shared_mem: int = 0, stream: Any = None
    ) -> PreparedLaunch:
        """A launch with its arguments packed once, into a buffer of its own: calling it
        costs one ``cuLaunchKernel``. The stream is resolved now (pass it explicitly if
        it will change); repack with a new ``prepare`` when the arguments change."""
        self._check_open()
        drv = driver.driver()
        driver.ensure_context()
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
            self,
            drv,
            (*_dim3(grid), *_dim3(block)),
            shared_mem,
            stream_handle(stream),
            (storage, ptrs, tuple(args)),
        )

    def __call__(self, *args: Any) -> Any:
        raise LoadError(f"{self.name} is a CUDA kernel: use .launch(grid, block, args)")


class PreparedLaunch:
    """A packed launch; ``p()`` enqueues it again. Keeps its arguments alive; refuses
    once its kernel's module is closed."""

    __slots__ = ("_call", "_keep")

    def __init__(
        self,
        kernel: CudaKernel,
        drv: Any,
        dims: tuple[int, ...],
        shared_mem: int,
        stream: int,
        keep: tuple[Any, Any, tuple[Any, ...]],
    ) -> None:
        launch, success, fn = drv.cuLaunchKernel, drv.CUresult.CUDA_SUCCESS, kernel._fn
        gx, gy, gz, bx, by, bz = dims
        params = ctypes.addressof(keep[1])
        self._keep = keep

        def call() -> None:
            if kernel._closed:
                raise LoadError(f"kernel {kernel.name}: its module is closed")
            (err,) = launch(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)
            if err != success:
                raise LoadError(f"cuLaunchKernel failed: {err}")

        self._call = call

    def __call__(self) -> None:
        self._call()


def _dim3(value: Any) -> tuple[int, int, int]:
    try:
        dims = (value,) if isinstance(value, int) else tuple(value)
    except TypeError:
        dims = ()
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"a grid/block/cluster dimension must be 1-3 positive ints, got {value!r}")
    full = (*dims, 1, 1)
    return (full[0], full[1], full[2])
