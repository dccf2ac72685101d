"""When a host kernel's library is unloaded: never under a call still running (closing
the runtime, or the module, while another thread was inside a kernel unmapped its code
and crashed the process), and once nothing holds it, at the latest at a collection."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import gc, json, sys, threading, time
import safejit
cache = sys.argv[1]
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
src = safejit.Source(
    "long spin(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; return s; }\n", "spin"
)
k = rt.compile(src).kernel("spin")
mapped = lambda: sum("memfd:safejit-spin" in line for line in open("/proc/self/maps"))
inside, out = threading.Event(), {}

def worker():
    inside.set()
    out["value"] = k(300_000_000)  # (about 0.1-0.5 s: the close comes while it runs)

t = threading.Thread(target=worker)
t.start()
inside.wait()
time.sleep(0.02)
running = t.is_alive()
rt.close()
closed_while_running = running and t.is_alive()
t.join()
try:
    k(1)
    after = "called"
except safejit.LoadError:
    after = "LoadError"
was_mapped = mapped()
del k, t, worker
gc.collect()
print(json.dumps({"value": out.get("value"), "closed_while_running": closed_while_running, "after": after,
                  "mapped_after_close": was_mapped, "mapped_after_collect": mapped()}))
"""


def test_closing_while_a_kernel_runs_lets_the_call_end_then_unloads(tmp_path):
    ran = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "c")], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, (ran.returncode, ran.stderr[-2000:])  # (-11: the code was unmapped under the call)
    got = json.loads(ran.stdout)
    assert got["value"] == sum(range(300_000_000))
    assert got["after"] == "LoadError"  # (a closed module's kernels refuse)
    assert got["mapped_after_close"] >= 1 and got["mapped_after_collect"] == 0
