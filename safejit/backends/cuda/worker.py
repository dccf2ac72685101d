"""The isolated NVRTC worker: ``python -I -m safejit.backends._nvrtc_worker ARCH``.

It loads NVRTC, compiles once to finish loading everything NVRTC needs, then
takes away its own filesystem and network access (Landlock, when the kernel
offers it; ``--require-landlock`` makes that mandatory) and serves compile
requests on stdin/stdout as length-prefixed JSON. Headers arrive in the
request: NVRTC can read nothing else. Replies carry no pickles, so a
compromised worker cannot run code in the parent.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import struct
import sys
import tempfile
from typing import Any

from safejit.backends.cuda.nvrtc import NvrtcRequest, NvrtcResult, nvrtc_compile_once
from safejit.sandbox.landlock import restrict as landlock_restrict

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
    )


def _reply(result: NvrtcResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "log": result.log,
        "cubin": base64.b64encode(result.cubin).decode(),
        "lowered": result.lowered,
        "missing": result.missing,
    }


def main(argv: list[str]) -> int:
    arch = argv[0] if argv else "sm_90"
    warm = NvrtcRequest(b'extern "C" __global__ void safejit_warm() {}\n', "warm", [f"--gpu-architecture={arch}"], [])
    nvrtc_compile_once(warm)
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
    # An empty working directory: even without Landlock, a relative include finds nothing.
    os.chdir(tempfile.mkdtemp(prefix="safejit-nvrtc-"))
    landlock_restrict([], [], deny_net=True, required="--require-landlock" in argv)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply channel
    while True:
        msg = _read(stdin)
        if msg is None:
            return 0
        try:
            result = nvrtc_compile_once(_request(msg))
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
                },
            )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
