"""Ascend: argument packing to the kernel ABI, and loading and launching through
CANN's runtime (``acl`` / ``libascendcl.so``), imported only when a kernel is loaded.

ABI: every argument is aligned to ``max(alignof, 4)``, the total is rounded up
to 8; only trivially copyable scalars (ctypes scalar types) and device pointers
are accepted.

The PyPI package named ``pyacl`` is an unrelated access-control library that
installs a module also called ``acl``; it is detected and refused.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import threading
from collections.abc import Sequence
from typing import Any, Final

from ...errors import ConfigError, KernelNotFoundError, LoadError

__all__ = ["AscendKernel", "AscendLibrary", "pack_arguments", "slot_layout"]

_SCALARS = (
    ctypes.c_bool,
    ctypes.c_int8,
    ctypes.c_uint8,
    ctypes.c_int16,
    ctypes.c_uint16,
    ctypes.c_int32,
    ctypes.c_uint32,
    ctypes.c_int64,
    ctypes.c_uint64,
    ctypes.c_float,
    ctypes.c_double,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_ssize_t,
    ctypes.c_char,
    ctypes.c_byte,
    ctypes.c_ubyte,
    ctypes.c_short,
    ctypes.c_ushort,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_long,
    ctypes.c_ulong,
    ctypes.c_longlong,
    ctypes.c_ulonglong,
)


def slot_layout(types: Sequence[Any]) -> tuple[list[int], int]:
    """Offsets of each argument and the total size under the Ascend kernel ABI."""
    offsets, pos = [], 0
    for t in types:
        if t not in _SCALARS:
            raise ConfigError(f"{getattr(t, '__name__', t)!r} is not a trivially copyable scalar or pointer type")
        align = max(ctypes.alignment(t), 4)
        pos = (pos + align - 1) // align * align
        offsets.append(pos)
        pos += ctypes.sizeof(t)
    return offsets, (pos + 7) // 8 * 8


def _device_pointer(arg: Any) -> int | None:
    data_ptr = getattr(arg, "data_ptr", None)  # torch_npu tensors
    if callable(data_ptr):
        device = getattr(getattr(arg, "device", None), "type", None)
        if device is not None and device != "npu":  # (a host address the kernel would read as device memory)
            raise ConfigError(f"a tensor on {device!r} cannot be an Ascend kernel's argument: move it to the NPU")
        return int(data_ptr())
    return None


def _scalar(t: Any, arg: bool | int | float) -> Any:
    """``t(arg)``, or ConfigError when ``arg`` is not exactly what ``t`` holds: ctypes wraps
    an int that does not fit (a pointer of 2**70 became NULL), takes no float for an int,
    and makes inf of a finite double too large for a float."""
    try:
        value = t(arg)
    except (TypeError, OverflowError) as exc:
        raise ConfigError(f"cannot pass {arg!r} as {t.__name__}: {exc}") from None
    if isinstance(arg, int) and not isinstance(arg, bool) and (value.value or 0) != arg:
        raise ConfigError(f"{arg} does not fit {t.__name__}")
    if isinstance(arg, float) and math.isfinite(arg) and not math.isfinite(value.value):
        raise ConfigError(f"{arg} does not fit {t.__name__}")
    return value


def pack_arguments(types: Sequence[Any], args: Sequence[Any]) -> bytes:
    """The host argument block for ``args`` declared as ``types``."""
    if len(types) != len(args):
        raise ConfigError(f"{len(types)} parameter types for {len(args)} arguments")
    offsets, total = slot_layout(types)
    block = bytearray(total)
    for t, off, arg in zip(types, offsets, args, strict=True):
        ptr = _device_pointer(arg)
        if ptr is not None:
            if t is not ctypes.c_void_p:
                raise ConfigError(f"a device tensor needs a c_void_p parameter, not {t.__name__}")
            value: Any = ctypes.c_void_p(ptr)
        elif isinstance(arg, t):
            value = arg
        elif isinstance(arg, (bool, int, float)) and not (t is ctypes.c_void_p and isinstance(arg, float)):
            value = _scalar(t, arg)
        else:
            raise ConfigError(f"cannot pass {type(arg).__name__} as {t.__name__}")
        raw = bytes(value)
        block[off : off + len(raw)] = raw
    return bytes(block)


def _acl() -> Any:
    """CANN's ``acl`` module, refusing the unrelated PyPI ``pyacl`` — before running any of
    its code: CANN's is an extension module, that package's is Python source."""
    acl = sys.modules.get("acl", _NOT_IMPORTED)
    if acl is None:  # (imports of it blocked)
        raise LoadError("CANN's Python runtime (module 'acl') is not importable; source the CANN set_env.sh")
    if acl is _NOT_IMPORTED:
        try:
            spec = importlib.util.find_spec("acl")
        except (ImportError, ValueError) as exc:
            raise LoadError(f"the module 'acl' cannot be found: {exc}") from None
        if spec is None:
            raise LoadError("CANN's Python runtime (module 'acl') is not importable; source the CANN set_env.sh")
        if not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            raise LoadError(_IMPOSTOR.format(where=spec.origin))
        try:
            acl = importlib.import_module("acl")
        except Exception as exc:
            raise LoadError(f"CANN's Python runtime (module 'acl') failed to import: {exc}") from None
    if not hasattr(acl, "rt"):
        raise LoadError(_IMPOSTOR.format(where=getattr(acl, "__file__", "?")))
    return acl


_NOT_IMPORTED: Final = object()
_IMPOSTOR: Final = (
    "the module 'acl' at {where} is not CANN's pyACL (an extension module with 'rt'; the PyPI package "
    "'pyacl' is an unrelated access-control library): uninstall it"
)


def _ascendcl() -> Any:
    try:
        return ctypes.CDLL("libascendcl.so")
    except OSError as exc:
        raise LoadError(f"CANN's runtime library cannot be loaded: {exc}; source the CANN set_env.sh") from None


class AscendLibrary:
    """A device binary, loaded from the verified bytes on first use."""

    def __init__(
        self, binary: bytes, name: str, kernels: Sequence[str], *, acl: Any = None, ascendcl: Any = None
    ) -> None:
        self._binary = binary
        self._name = name
        self._kernels = set(kernels)
        self._acl, self._cl = acl, ascendcl
        self._handle: int | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _load(self) -> int:
        with self._lock:
            if self._closed:
                raise LoadError(f"{self._name}: library is closed")
            if self._handle is None:
                self._acl = self._acl or _acl()
                self._cl = self._cl or _ascendcl()
                handle, ret = self._acl.rt.binary_load_from_data(self._binary, len(self._binary), 0)
                if ret != 0:
                    raise LoadError(f"{self._name}: aclrtBinaryLoadFromData failed ({ret})")
                self._handle = int(handle)
            return self._handle

    def function(self, name: str, **options: Any) -> AscendKernel:
        if name not in self._kernels:
            raise KernelNotFoundError(f"no kernel {name!r}; this binary has {sorted(self._kernels)}", name=name)
        argtypes = options.get("argtypes")
        if argtypes is None:
            raise ConfigError(f"{name}: Ascend kernels need argtypes (the ABI carries no parameter types)")
        handle = self._load()
        fn, ret = self._acl.rt.binary_get_function(handle, name)
        if ret != 0:
            raise LoadError(f"{name}: aclrtBinaryGetFunction failed ({ret})")
        return AscendKernel(name, int(fn), list(argtypes), self._cl)

    def close(self) -> None:
        with self._lock:
            handle, self._handle, self._closed = self._handle, None, True
        if handle is not None and self._acl is not None:
            self._acl.rt.binary_unload(handle)


class AscendKernel:
    """``launch(num_blocks, args, *, stream=None, timeout_s=None)``."""

    def __init__(self, name: str, fn: int, argtypes: list[Any], ascendcl: Any) -> None:
        self.name = name
        self._fn = fn
        self._argtypes = argtypes
        self._cl = ascendcl
        slot_layout(argtypes)  # validate now, not at the first launch

    def launch(
        self,
        num_blocks: int,
        args: Sequence[Any] = (),
        *,
        stream: Any = None,
        timeout_s: int | None = None,
        **other: Any,
    ) -> None:
        if other:  # (a misspelt keyword — timeout=, steam= — was ignored, the launch made without it)
            raise ConfigError(f"{self.name}: launch takes no {sorted(other)} (num_blocks, args, stream, timeout_s)")
        if type(num_blocks) is not int or not 1 <= num_blocks < 2**32:
            raise ConfigError(f"num_blocks must be an int from 1 to 2**32 - 1, got {num_blocks!r}")
        if timeout_s is not None and type(timeout_s) is not int:
            raise ConfigError(f"timeout_s must be an int, got {timeout_s!r}")
        block = pack_arguments(self._argtypes, args)
        buf = ctypes.create_string_buffer(block, len(block))
        cfg = None
        if timeout_s is not None:
            cfg = _launch_config(timeout_s)
        # Read the stream handle right before launching: torch_npu's task queue may
        # otherwise run this kernel before earlier queued operations.
        handle = _stream_handle(stream)
        fn = self._cl.aclrtLaunchKernelWithHostArgs
        ret = fn(
            ctypes.c_void_p(self._fn),
            ctypes.c_uint32(num_blocks),
            ctypes.c_void_p(handle),
            cfg,
            buf,
            ctypes.c_size_t(len(block)),
            None,
            ctypes.c_size_t(0),
        )
        if ret != 0:
            raise LoadError(f"{self.name}: aclrtLaunchKernelWithHostArgs failed ({ret})")

    def __call__(self, *args: Any) -> Any:
        raise LoadError(f"{self.name} is an Ascend kernel: use .launch(num_blocks, args)")


class _LaunchAttrValue(ctypes.Union):
    _fields_ = (("timeout", ctypes.c_uint16), ("rsv", ctypes.c_uint32 * 4))


class _LaunchAttr(ctypes.Structure):  # aclrtLaunchKernelAttr
    _fields_ = (("id", ctypes.c_int32), ("value", _LaunchAttrValue))


class _LaunchCfg(ctypes.Structure):  # aclrtLaunchKernelCfg
    _fields_ = (("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_size_t))


#: aclrtLaunchKernelAttrId: ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT (seconds, uint16).
_ATTR_TIMEOUT = 7


def _launch_config(timeout_s: int) -> Any:
    if not 0 < timeout_s < 65536:
        raise ConfigError(f"launch timeout must be 1..65535 seconds, got {timeout_s}")
    value = _LaunchAttrValue()
    value.timeout = timeout_s
    attr = _LaunchAttr(_ATTR_TIMEOUT, value)
    cfg = _LaunchCfg(ctypes.pointer(attr), 1)
    return ctypes.byref(cfg)


def _stream_handle(stream: Any) -> int:
    if stream is None:
        torch = sys.modules.get("torch")
        npu = getattr(torch, "npu", None) if torch is not None else None
        if npu is not None:
            return int(npu.current_stream().npu_stream)
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    handle = getattr(stream, "npu_stream", None)
    if handle is not None:
        return int(handle)
    raise ConfigError(f"cannot use {type(stream).__name__} as an Ascend stream")
