"""The only runner of untrusted processes: compilers given as argv lists, and the
NVRTC worker.

- ``runner``: :class:`~safejit.sandbox.runner.Sandbox` — rlimits, Landlock, a new
  process group killed on timeout, captured output, spare shims started ahead.
- ``landlock``: the Landlock syscall numbers and access masks (their one home) and
  in-process restriction.
- ``shim.c``: the exec shim (built once per user by ``_shim_build``); ``_pyshim.py``
  is its standard-library fallback, run as a standalone script.
- ``_wait``: waiting for a process (output, exit, deadline); ``_closewatch``:
  noticing, while it runs, that it closed a file it wrote (inotify).
"""

from __future__ import annotations

from typing import Final

__all__ = ["SYSTEM_PATH"]

#: The only PATH sandboxed compilers, probes and the shim's build see.
SYSTEM_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
