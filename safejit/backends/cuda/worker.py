"""The isolated NVRTC worker: ``python -I -c ... ARCH [options]``.

It loads NVRTC, then takes away its own filesystem and network access (Landlock,
when the kernel offers it; ``--require-landlock`` makes that mandatory): it may read
only under ``--roots`` (the declared source roots and the toolchain's include dirs)
and NVRTC's builtins library (which its first compile loads), none at all without;
then it compiles once, confined, to finish loading what NVRTC needs.
With ``--lookups LIBRARY`` it then installs the lookup recorder
(``safejit.sandbox.lookups``), and a request that asks for it gets back every path
NVRTC looked up while compiling, found or not. It first writes a hello
(``{"recording": bool, "why": str, "landlock": bool}``), then serves compile requests on stdin/stdout
as length-prefixed JSON. Replies carry no pickles, so a compromised worker cannot
run code in the parent.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import resource
import struct
import sys
import tempfile
from typing import Any

from safejit.backends.cuda.nvrtc import NvrtcRequest, NvrtcResult, library_path, nvrtc_compile_once
from safejit.sandbox.landlock import LandlockError
from safejit.sandbox.landlock import restrict as landlock_restrict
from safejit.sandbox.lookups import Lookup, Recorder

_LEN = struct.Struct(">I")


def _read(stream: Any) -> dict[str, Any] | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = _LEN.unpack(head)
    data: dict[str, Any] = json.loads(stream.read(n))
    return data


def _write(stream: Any, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _request(msg: dict[str, Any]) -> NvrtcRequest:
    return NvrtcRequest(
        code=base64.b64decode(msg["code"]),
        name=msg["name"],
        options=list(msg["options"]),
        name_expressions=list(msg["name_expressions"]),
        headers={k: base64.b64decode(v) for k, v in msg["headers"].items()},
        record=bool(msg.get("record", False)),
        max_cubin=None if msg.get("max_cubin") is None else int(msg["max_cubin"]),
    )


def _reply(result: NvrtcResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "log": result.log,
        "cubin": base64.b64encode(result.cubin).decode(),
        "lowered": result.lowered,
        "missing": result.missing,
        "lookups": result.lookups,
        "too_large": result.too_large,
    }


def _lookups(found: list[Lookup], cwd: str) -> list[tuple[str, int, int, str]]:
    """The lookups to report, once each, absolute; those of this worker's own (empty,
    private) working directory left out: NVRTC looks for a few names there."""
    out: dict[tuple[str, int, int, str], None] = {}
    own = cwd.rstrip("/") + "/"
    for item in found:
        path = os.path.normpath(os.path.join(cwd, item.path)) if not item.path.startswith("/") else item.path
        if path == cwd or path.startswith(own):
            continue
        out.setdefault((item.kind, item.error, item.flags, path))
    return list(out)


def _options(argv: list[str]) -> tuple[list[str], str | None, bool]:
    roots: list[str] = []
    library = None
    i = 1
    while i < len(argv):
        if argv[i] == "--roots":
            roots = list(json.loads(argv[i + 1]))
            i += 1
        elif argv[i] == "--lookups":
            library = argv[i + 1]
            i += 1
        i += 1
    return roots, library, "--require-landlock" in argv


def main(argv: list[str]) -> int:
    arch = argv[0] if argv else "sm_90"
    roots, library, required = _options(argv)
    warm = NvrtcRequest(b'extern "C" __global__ void safejit_warm() {}\n', "warm", [f"--gpu-architecture={arch}"], [])
    from cuda.bindings import nvrtc

    nvrtc.nvrtcVersion()  # (NVRTC itself loaded while everything may still be read)
    # Its builtins library, which the first compile loads: those files alone, not their dir
    # (which may hold the CUDA driver, or be /usr/lib/<triple>).
    with os.scandir(os.path.dirname(library_path())) as it:
        own = [e.path for e in it if e.name.startswith("libnvrtc-builtins.so") and e.is_file()]
    # An empty working directory, removed at once: even without Landlock a relative include
    # finds nothing (nothing can be made in a removed directory), and however the worker
    # ends (killed at a timeout), it leaves nothing behind.
    cwd = tempfile.mkdtemp(prefix="safejit-nvrtc-")
    os.chdir(cwd)
    os.rmdir(cwd)
    recorder = Recorder(library) if library else None  # (loaded while it can still be read)
    try:
        landlocked = landlock_restrict([*roots, *own], [], deny_net=True, required=required)
    except LandlockError as exc:  # (said in the hello: the parent raises it, named)
        _write(sys.stdout.buffer, {"recording": False, "why": "", "landlock": False, "refused": str(exc)})
        return 3
    # The first compile, confined: NVRTC loads its builtins from its own dir, and where the
    # CUDA driver is installed it cannot load that (it lies outside what the worker may
    # read), so the driver's thread, which Landlock would leave unconfined, never starts.
    nvrtc_compile_once(warm)
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
    why = "" if library else "no recorder"
    if recorder is not None:
        try:
            recorder.install()
        except OSError as exc:
            recorder, why = None, str(exc)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply channel
    _write(stdout, {"recording": recorder is not None, "why": why, "landlock": landlocked})
    while True:
        msg = _read(stdin)
        if msg is None:
            return 0
        try:
            req = _request(msg)
            if req.record and recorder is None:
                raise OSError(f"lookups cannot be recorded here ({why})")
            if recorder is not None and req.record:
                recorder.begin()
                try:
                    result = nvrtc_compile_once(req)
                finally:
                    found = recorder.end()
                result.lookups = _lookups(found, cwd)
            else:
                result = nvrtc_compile_once(req)
            _write(stdout, _reply(result))
        except Exception as exc:
            _write(
                stdout,
                {
                    "ok": False,
                    "log": f"worker error: {type(exc).__name__}: {exc}",
                    "cubin": "",
                    "lowered": {},
                    "missing": [],
                    "lookups": None,
                    "error": "E2BIG" if isinstance(exc, OSError) and exc.errno == errno.E2BIG else type(exc).__name__,
                },
            )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
