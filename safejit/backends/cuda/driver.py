"""The CUDA driver, through ``cuda.bindings``: loaded and initialised once per
process (a missing driver is a :class:`~safejit.errors.LoadError`, remembered), the
current context, the device's architecture, and the address of ``cuLaunchKernelEx``
for the C launch path (``fastpath``)."""

from __future__ import annotations

import threading
from typing import Any

from ... import _env
from ...errors import LoadError

__all__ = [
    "check",
    "device_arch",
    "driver",
    "ensure_context",
    "has_cuda_device",
    "launch_ex_address",
    "loaded",
    "unload",
]

_state: dict[str, Any] = {}
_lock = threading.Lock()
#: cuLaunchKernelEx's ABI is CUDA 12.0's.
_LAUNCH_EX_VERSION = 12000


def driver() -> Any:
    """``cuda.bindings.driver`` after a successful ``cuInit``; raises LoadError without a driver."""
    with _lock:
        if "driver" in _state:
            return _state["driver"]
        if "error" in _state:
            raise LoadError(_state["error"])
        try:
            from cuda.bindings import driver as drv

            (err,) = drv.cuInit(0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuInit failed: {err}")
            err, count = drv.cuDeviceGetCount()
            if err != drv.CUresult.CUDA_SUCCESS or count < 1:
                raise RuntimeError("no CUDA device")
        except Exception as exc:
            _state["error"] = f"no usable CUDA driver/device: {type(exc).__name__}: {exc}"
            raise LoadError(_state["error"]) from exc
        _state["driver"] = drv
        return drv


def loaded() -> Any | None:
    """The driver module if :func:`driver` has succeeded in this process, else None."""
    return _state.get("driver")


def has_cuda_device() -> bool:
    """Probe the driver (cheaply, once)."""
    try:
        driver()
    except LoadError:
        return False
    return True


def check(result: Any, what: str) -> Any:
    """The value(s) of a ``cuda.bindings`` call; its error as a LoadError."""
    drv = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise LoadError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def ensure_context() -> Any:
    """The current context, or the primary context of device 0 made current
    (the one PyTorch and CuPy use)."""
    drv = driver()
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        dev = check(drv.cuDeviceGet(0), "cuDeviceGet")
        ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def device_arch() -> str | None:
    """``sm_XY`` of the current (or first) device; None when there is none."""
    if not has_cuda_device():
        return None
    drv = driver()
    ensure_context()
    dev = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = drv.CUdevice_attribute
    major = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
    minor = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
    return f"sm_{major}{minor}"


def launch_ex_address() -> int:
    """The address of ``cuLaunchKernelEx`` in the driver ``cuda.bindings`` loaded, with
    the default-stream semantics ``cuda.bindings`` uses (per-thread when
    ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` says so); 0 when the driver has none."""
    drv = driver()
    flags = drv.CUdriverProcAddress_flags
    mode = (
        flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        if _env.cuda_per_thread_default_stream()
        else flags.CU_GET_PROC_ADDRESS_DEFAULT
    )
    err, address, found = drv.cuGetProcAddress(b"cuLaunchKernelEx", _LAUNCH_EX_VERSION, mode)
    ok = err == drv.CUresult.CUDA_SUCCESS and found == drv.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS
    return int(address) if ok else 0


def unload(library: Any) -> None:
    """``cuLibraryUnload`` — only if the driver was ever loaded (a library was)."""
    drv = loaded()
    if drv is not None:
        drv.cuLibraryUnload(library)
