"""Packing kernel arguments by the parameter layout read from the cubin.

A Python ``int``/``float`` takes exactly the parameter's width (never a silent
width mismatch); pointers come from torch tensors (``data_ptr()``), CuPy arrays
and ``__cuda_array_interface__`` objects; NumPy and ctypes scalars must have the
parameter's size. :func:`encode_argument` is the general rule and names every
mismatch; :func:`make_packer` compiles the same rules, for one tuple of argument
types, into a function that packs a whole call at once, and :func:`native_plan`
states them, for the same tuple, as the C launch path takes them (``fastlaunch.c``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from ...errors import ConfigError

__all__ = ["NATIVE_KINDS", "NO_PLAN", "encode_argument", "make_packer", "native_plan"]

_INT = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT = {2: "e", 4: "f", 8: "d"}


def make_packer(
    params: Sequence[tuple[int, int]], args: Sequence[Any], kinds: tuple[type, ...]
) -> Callable[[memoryview, Any], bool] | None:
    """The packing function for arguments of these types, or None when one has none.

    It is generated from fixed text (argument positions and reader names only) and
    returns False — packing nothing it cannot — when the arguments are not of these
    types or a value does not fit, so the caller falls back to the general path.
    """
    fmt, pos, values = "<", 0, []
    for i, (arg, (offset, size)) in enumerate(zip(args, params, strict=True)):
        step = _plan_one(arg, size) if offset >= pos else None
        if step is None:
            return None
        code, reader = step
        fmt += "x" * (offset - pos) + code
        pos = offset + size
        values.append(f"a{i}" if reader is None else _READERS[reader].format(f"a{i}"))
    names = [f"a{i}" for i in range(len(args))]
    checks = " or ".join(f"type(a{i}) is not t{i}" for i in range(len(args))) or "False"
    source = (
        "def packer(view, args):\n"
        "    try:\n"
        f"        ({''.join(n + ', ' for n in names)}) = args\n"
        f"        if {checks}:\n"
        "            return False\n"
        f"        pack_into(view, 0, {', '.join(values)})\n"
        "    except (ValueError, TypeError, AttributeError, OverflowError, struct_error):\n"
        "        return False\n"
        "    return True\n"
    )
    scope: dict[str, Any] = {
        "pack_into": struct.Struct(fmt).pack_into,
        "struct_error": struct.error,
        **{f"t{i}": kind for i, kind in enumerate(kinds)},
    }
    exec(source, scope)  # noqa: S102 - fixed text: positions and the reader expressions above
    packer: Callable[[memoryview, Any], bool] = scope["packer"]
    return packer


#: ctypes' integer type codes (c_int32 is "i", ...): the types an int may not overflow.
_INT_CODES: Final = frozenset("bBhHiIlLqQ")


def encode_argument(arg: Any, size: int, declared: Any, kernel: str, index: int) -> bytes:
    """The bytes of one argument for a parameter of ``size`` bytes."""
    where = f"{kernel} argument {index}"
    if declared is not None:
        value = declared(arg) if not isinstance(arg, declared) else arg
        if isinstance(arg, int) and getattr(declared, "_type_", "") in _INT_CODES and value.value != arg:  # (wraps)
            raise ConfigError(f"{where}: {arg} does not fit the declared {declared.__name__}")
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


NO_PLAN: Any = object()
#: How a plan reads an argument's value: the expression the generated packer uses.
_READERS: dict[str, str] = {
    "data_ptr": "{}.data_ptr()",
    "data_dot_ptr": "{}.data.ptr",
    "tobytes": "{}.tobytes()",
    "to_bytes": "bytes({})",
}


#: How the C launch path reads a value (``fastlaunch.c``'s ``K_*``), by the reader a
#: plan names: None is the number itself (an ``int`` or a ``float``).
NATIVE_KINDS: dict[str | None, int] = {None: 0, "data_ptr": 2, "data_dot_ptr": 3, "tobytes": 4, "to_bytes": 4}
_NATIVE_FLOAT: Final = 1


def native_plan(
    params: Sequence[tuple[int, int]], args: Sequence[Any]
) -> tuple[tuple[type, ...], tuple[int, ...]] | None:
    """The plan the C launch path packs arguments of these types by — each one's exact
    type and how its value is read — or None when one has no plan or the C path packs
    it differently (a half-precision ``float``: Python's ``struct`` packs those)."""
    if len(args) != len(params):
        return None
    kinds = []
    for arg, (_, size) in zip(args, params, strict=True):
        step = _plan_one(arg, size)
        if step is None or (type(arg) is float and size == 2):
            return None
        kinds.append(_NATIVE_FLOAT if type(arg) is float else NATIVE_KINDS[step[1]])
    return tuple(map(type, args)), tuple(kinds)


def _plan_one(arg: Any, size: int) -> tuple[str, str | None] | None:
    """How one argument of this type packs into ``size`` bytes (struct code, reader
    name), if it always packs the same way; the same rules as :func:`encode_argument`."""
    kind = type(arg)
    if kind is int:
        return (_INT[size], None) if size in _INT else None
    if kind is float:
        return (_FLOAT[size], None) if size in _FLOAT else None
    if callable(getattr(arg, "data_ptr", None)):  # torch.Tensor
        return ("Q", "data_ptr") if size == 8 else None
    if hasattr(kind, "__cuda_array_interface__"):
        if isinstance(getattr(getattr(arg, "data", None), "ptr", None), int):  # CuPy
            return ("Q", "data_dot_ptr") if size == 8 else None
        return None
    if isinstance(arg, ctypes._SimpleCData):
        return (f"{size}s", "to_bytes") if ctypes.sizeof(kind) == size else None
    dtype = getattr(arg, "dtype", None)
    # NumPy scalars only, whose type fixes their dtype: the packer checks the type alone,
    # and a later ndarray of another dtype or shape would pass it (packed truncated or padded)
    if dtype is not None and getattr(arg, "ndim", None) == 0 and getattr(dtype, "kind", "") in "biuf":
        if any(c.__name__ == "ndarray" for c in kind.__mro__):  # (subclasses too: masked, memmap)
            return None
        return (f"{size}s", "tobytes") if dtype.itemsize == size else None
    return None


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
