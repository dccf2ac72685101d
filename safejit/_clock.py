"""The clock the staleness guarantee is kept by (``max_staleness_s``, the toolchain's
recheck): seconds that go on counting while the machine is suspended.

``time.monotonic`` (CLOCK_MONOTONIC) stops during a suspend: a kernel checked just
before one was taken as checked a moment ago after it, however long the machine slept
and whatever changed on a shared file system meanwhile. CLOCK_BOOTTIME counts that
time (Linux); elsewhere it is ``time.monotonic``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Final

__all__ = ["now"]

#: Seconds, for differences only (as ``time.monotonic``).
now: Final[Callable[[], float]] = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)
