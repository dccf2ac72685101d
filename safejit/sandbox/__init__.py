"""The only runner of untrusted processes: compilers given as argv lists, and the
NVRTC worker.

- ``runner``: :class:`~safejit.sandbox.runner.Sandbox` — the walls (Landlock,
  seccomp, a user and mount namespace with a bounded scratch tmpfs, an unprivileged
  uid, rlimits), a new process group killed on timeout, captured output, spare
  shims started ahead; ``describe()`` says which walls a run gets.
- ``landlock``: the Landlock syscall numbers and access masks (their one home) and
  in-process restriction. ``seccomp``: the seccomp filter (its one home).
- ``statedir``: this user's private state dir (the shim, the stat memo, the probes),
  outside every cache root.
- ``shim.c``: the exec shim (built once per user by ``_shim_build``, run through its
  descriptor); ``_pyshim.py`` is its standard-library fallback, run as a standalone
  script. ``_launch``: starting a shim and talking to it; ``_scratch``: the tmpfs
  as this process reaches it.
- ``extensions``: a backend's C extension (the CUDA launch path) built for this
  Python like the shim (once per user, into the state dir) and imported through its
  checked descriptor.
- ``_wait``: waiting for a process (output, exit, deadline); ``_closewatch``:
  noticing, while it runs, that it closed a file it wrote (inotify).
- ``lookups``: the lookup recorder (``lookups.c``): every path a process looks up,
  recorded by a seccomp trap — in the NVRTC worker, and preloaded into a compiler
  run (the shim holds it open on descriptor 200), in the preprocessors (GCC's cc1, clang -cc1).

Usage::

    sb = Sandbox("auto", cc="/usr/bin/cc")
    result = sb.run(["/usr/bin/cc", "-c", "k.c"], cwd=work, env={"PATH": SYSTEM_PATH},
                    timeout=60, read_roots=[src], write_roots=[work])
    sb.describe()  # e.g. "landlock-v7+seccomp+userns+tmpfs+nproc+rlimits"
"""

from __future__ import annotations

from typing import Final

__all__ = ["SYSTEM_PATH"]

#: The only PATH sandboxed compilers, probes and the shim's build see.
SYSTEM_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
