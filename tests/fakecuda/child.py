"""What the fake driver (``libcuda.c`` here) saw, read from inside a child process
that loaded it as ``libcuda.so.1`` (``LD_LIBRARY_PATH``)."""

from __future__ import annotations

import ctypes
from typing import Any

FAKE = ctypes.CDLL("libcuda.so.1")
ENTRIES = {1: "cuLaunchKernel", 2: "cuLaunchKernelEx"}


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


FAKE.fake_last_config.restype = ctypes.POINTER(_Config)
FAKE.fake_last_function.restype = ctypes.c_void_p
FAKE.fake_last_param.restype = ctypes.POINTER(ctypes.c_ubyte * 32)
_sizes: list[int] = []


def set_layout(sizes: list[int]) -> None:
    """Record the bytes of parameters of these sizes from the next launch on."""
    _sizes[:] = sizes
    FAKE.fake_set_layout(len(sizes), (ctypes.c_uint * max(len(sizes), 1))(*sizes))


def counts() -> dict[str, int]:
    out = (ctypes.c_long * 3)()
    FAKE.fake_counts(out)
    return {"loads": out[0], "unloads": out[1], "launches": out[2]}


def last_launch() -> dict[str, Any]:
    config = FAKE.fake_last_config().contents
    return {
        "entry": ENTRIES.get(FAKE.fake_last_entry()),
        "function": FAKE.fake_last_function() or 0,
        "grid": list(config.grid),
        "block": list(config.block),
        "shared_mem": config.shared_mem,
        "stream": config.stream or 0,
        "params": [bytes(FAKE.fake_last_param(i).contents[:size]).hex() for i, size in enumerate(_sizes)],
    }
