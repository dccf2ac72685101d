"""The C launch path (``fastlaunch.c``): built once per user and Python by the system
C compiler into the private state dir (``sandbox.extensions``), imported once per
process and wired to the driver — its ``cuLaunchKernelEx``, the stream readers, the
context and the error a failed launch raises.

Why C: a launch through Python packs, reads the stream and calls the driver in a
dozen bytecode-level steps, which cost more than cuda.core's whole ``launch`` (a
Cython function); the C launcher does the same steps at C speed and hands anything
unusual back to the Python path (``launch.py``), which stays the reference. Where it
cannot be built (no compiler, no ``Python.h``), launches take the Python path.
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Any, NoReturn

from ...errors import LoadError
from ...sandbox import extensions
from ...sandbox.statedir import StateDir
from . import driver, streams

__all__ = ["NAME", "module", "source"]

logger = logging.getLogger("safejit.cuda.launch")

#: The init function's name is ``PyInit_`` + this.
NAME = "safejit_cuda_launch"
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}


def module(state: StateDir | None, cc: str | None) -> ModuleType | None:
    """The C launch path, configured; None where it cannot be had (said once, in the log).
    The first call in a process builds it into the private ``state`` dir, or finds it
    there; later calls reuse it."""
    with _lock:
        if NAME not in _loaded:
            fast = _load(state, cc)
            if fast is None and state is None:
                return None  # nothing was tried: a caller with a state dir may still build it
            _loaded[NAME] = fast
        return _loaded[NAME]


def source() -> bytes:
    """``fastlaunch.c``, read next to this module."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastlaunch.c"), "rb") as fh:
        return fh.read()


def _load(state: StateDir | None, cc: str | None) -> ModuleType | None:
    address = driver.launch_ex_address()
    if not address:
        logger.info("the driver has no cuLaunchKernelEx: launches take the Python path")
        return None
    fast = extensions.load(source(), NAME, state, cc)
    if fast is None:
        logger.info("the C launch path is not available here: launches take the Python path")
        return None
    fast.configure(address, streams.READERS, streams.torch_stream_functions, driver.ensure_context, _launch_failed)
    return fast


def _launch_failed(code: int) -> NoReturn:
    """What the C path raises when the driver refuses a launch."""
    drv: Any = driver.driver()
    try:
        name: Any = drv.CUresult(code)
    except ValueError:
        name = code
    raise LoadError(f"cuLaunchKernelEx failed: {name}")
