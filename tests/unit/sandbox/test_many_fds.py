"""A process with more than 1023 files open (a server) compiles: the waits on the
compiler and the NVRTC worker use poll, not select, which refuses such descriptors
(ValueError out of compile(), once a descriptor the wait needed got a number past 1023)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, resource, sys
import safejit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # (what the compile opens now numbers past 1023)
out = {}
with safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],))) as rt:
    out["host"] = rt.compile(safejit.Source("int add(int a, int b) { return a + b; }", "add")).kernel("add")(2, 3)
try:
    import safejit.backends.cuda.nvrtc as nvrtc
    nvrtc.library_path()
except Exception:
    out["nvrtc"] = "absent"
else:
    cfg = safejit.Config(backend="cuda", cache_dirs=(sys.argv[1] + "-cuda",))
    with safejit.Runtime(config=cfg) as rt:
        kernel = safejit.Source('extern "C" __global__ void k(int* p) { *p = 1; }', "k")
        out["nvrtc"] = rt.build(kernel, arch="sm_90").size > 0
print(json.dumps({**out, "highest": max(held)}))
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048, reason="the hard limit on open files is low")
def test_a_process_with_more_than_1023_files_open_compiles(tmp_path):
    ran = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "c")], capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout)
    assert got["highest"] > 1023 and got["host"] == 5 and got["nvrtc"] in (True, "absent")


def test_runtimes_with_other_cache_roots_share_the_state_dir_and_leave_no_descriptor(tmp_path, monkeypatch):
    """The private state dir is held open once per place and process: each Runtime with
    cache roots of its own used to open (and keep) another descriptor on it."""
    import gc
    import os

    import safejit
    from safejit.sandbox import statedir

    monkeypatch.setattr(statedir, "_opened", {})

    def open_fds() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    def one(i: int) -> None:
        with safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(tmp_path / f"c{i}"),))) as rt:
            rt.compile(safejit.Source(f"#define V {i}\n", "v"))

    one(0)
    before = open_fds()
    for i in range(1, 40):
        one(i)
    assert open_fds() <= before + 2  # (room for a descriptor the collector has not closed yet)
    assert len(statedir._opened) == 1
