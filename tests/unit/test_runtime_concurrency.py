"""Concurrent cold starts compile exactly once: threads in one process, and processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import safejit
from tests.conftest import assert_cache_sound, leaves

SLOW_C = "int triple(int x) { return 3 * x; }\n"

CHILD = r"""
import json, os, sys, time
import safejit
start_file, cache = sys.argv[1], sys.argv[2]
while not os.path.exists(start_file):
    time.sleep(0.001)
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
mod = rt.compile(safejit.Source(sys.argv[3], "triple"))
print(json.dumps({"value": mod.kernel("triple")(14), "stats": dict(rt.stats())}))
"""


def test_sixteen_threads_compile_once(make_runtime, cache_dir):
    rt = make_runtime()
    barrier = threading.Barrier(16)

    def work(_: int) -> tuple[int, safejit.Module]:
        barrier.wait()
        mod = rt.compile(safejit.Source(SLOW_C, "triple"))
        return mod.kernel("triple")(5), mod

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(work, range(16)))
    assert [value for value, _ in results] == [15] * 16
    assert len({id(mod) for _, mod in results}) == 1
    stats = rt.stats()
    assert stats["compiles"] == 1
    # Every request counted once (a caller that waited on another's compile was counted
    # nowhere: 'safejit stats' showed 1 request for 16)
    assert stats["memory_hits"] + stats["disk_hits"] + stats["misses"] == 16, stats
    assert len(leaves(cache_dir)) == 1


def test_eight_processes_cold_start_one_spec_and_compile_once(cache_dir, tmp_path):
    start = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(start), str(cache_dir), SLOW_C],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    time.sleep(0.5)  # let every child reach the starting line
    Path(start).touch()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["value"] for r in reports] == [42] * 8
    assert sum(r["stats"]["compiles"] for r in reports) == 1
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


FORK_CHILD = r"""
import os, sys, time
import safejit
from safejit.closure.hashing import hash_file
big = os.path.join(sys.argv[2], "big.bin")
with open(big, "wb") as f:
    f.write(os.urandom(4 << 20))
hash_file(big)  # on BLAKE3's threads, which a forked child does not have
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],)))
rt.compile(safejit.Source("int add(int a, int b) { return a + b; }\n", "add"))
pid = os.fork()
if pid == 0:
    digest = hash_file(big)[0]
    mod = rt.compile(safejit.Source('extern "C" int sub(int a, int b) { return a - b; }\n', "sub", filename="s.cpp"))
    print("child", len(digest), mod.kernel("sub")(5, 3), flush=True)
    os._exit(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("status", status, flush=True)
        sys.exit(0)
    time.sleep(0.05)
os.kill(pid, 9)
print("child hung", flush=True)
sys.exit(1)
"""


def test_a_child_forked_after_compiling_can_hash_and_compile(cache_dir, tmp_path):
    """BLAKE3's worker threads do not survive fork: a child must not wait on them."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, str(cache_dir), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "child 64 2" in out.stdout and "status 0" in out.stdout


FORK_BUSY_CHILD = r"""
import json, os, sys, threading, time
import safejit
from safejit import faults
from safejit.sandbox import statedir
cache = sys.argv[1]
rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(cache,)))
rt.compile(safejit.Source("#define A 1\n", "a"))  # (wired; a usage record to come)
# Another thread holds what a compile takes (the set-up lock, the state dir's) and has a
# compile in flight (slowed at the compiler's spawn) when this one forks.
hold, go = threading.Event(), threading.Event()
def holder():
    with rt._init_lock, statedir._lock, rt._wired[0].sandbox._spare_lock:
        hold.set()
        go.wait(30)
threading.Thread(target=holder).start()
with faults.inject("compiler.spawn", "delay:3"):
    flight = threading.Thread(target=lambda: rt.compile(safejit.Source("#define B 2\n", "b")))
    flight.start()
    hold.wait(10)
    time.sleep(0.3)  # (the compile of b is in flight)
    pid = os.fork()
if pid == 0:
    done = threading.Event()
    out = {}
    def child():
        import gc
        gc.collect()  # (the parent's parts, let go: their finalizers run here)
        out["b"] = rt.compile(safejit.Source("#define B 2\n", "b")).kernel("B")()
        out["c"] = rt.compile(safejit.Source("#define C 3\n", "c")).kernel("C")()
        out["stats"] = rt.stats()
        out["usage"] = rt._usage_name
        done.set()
    threading.Thread(target=child, daemon=True).start()
    ok = done.wait(20)
    print(json.dumps({"child": out if ok else "hung"}), flush=True)
    os._exit(0)
go.set()
flight.join()
os.waitpid(pid, 0)
print(json.dumps({"parent": rt.stats(), "usage": rt._usage_name}), flush=True)
rt.close()
"""


def test_a_child_forked_while_other_threads_compile_compiles_on_its_own(cache_dir):
    """fork() copies a lock as it is: one held by another thread (the Runtime's set-up
    lock, the state dir's) was held for good in the child, and a compile in flight there
    had no thread to finish it: the child's compiles waited forever. The child wires its
    own parts, compiles, and counts (and records) its own work."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_BUSY_CHILD, str(cache_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    child = next(r["child"] for r in reports if "child" in r)
    parent = next(r for r in reports if "parent" in r)
    assert child != "hung", out.stderr
    assert (child["b"], child["c"]) == (2, 3)
    assert child["stats"]["compiles"] + child["stats"]["disk_hits"] == 2  # its own two, not the parent's
    assert child["usage"] != parent["usage"]


def test_close_while_a_compile_is_under_way_refuses_its_entry(make_runtime):
    """close() cleared the memory tier, then a compile under way put its module there: a
    closed runtime served it from then on (the hot path has no check), never closed. And
    one that began before close() wired new parts after it, a spare shim process with
    them, which no one closed."""
    import threading

    from safejit import faults

    rt = make_runtime(backend="fake")
    src = safejit.Source("#define A 1\n", "a")
    got: dict[str, object] = {}

    def compile_() -> None:
        try:
            got["module"] = rt.compile(src)
        except safejit.SafejitError as exc:
            got["error"] = exc

    with faults.inject("compiler.spawn", "delay:1"):
        worker = threading.Thread(target=compile_)
        worker.start()
        time.sleep(0.3)  # (under way: past wiring, in the compiler's delay)
        rt.close()
        worker.join(30)
    assert isinstance(got.get("error"), safejit.LoadError), got
    assert rt.stats()["memory_entries"] == 0
    with pytest.raises(safejit.LoadError, match="closed"):
        rt.compile(src)
    with pytest.raises(safejit.LoadError, match="closed"):
        rt.explain(src)
    rt._wired = None  # (as before its first compile: nothing is wired once closed)
    with pytest.raises(safejit.LoadError, match="closed"):
        rt._init()
    assert rt._wired is None


def test_close_from_a_signal_handler_while_parts_are_wired_does_not_hang(make_runtime, monkeypatch):
    """close() took the set-up lock that the thread it interrupted (a signal handler's,
    a finalizer's) was holding while it wired the parts: it waited on itself for good."""
    from safejit import runtime as runtime_module

    rt = make_runtime(backend="fake")
    real = runtime_module.Parts

    def interrupted(*args, **kwargs):
        parts = real(*args, **kwargs)
        rt.close()  # (the handler, run in this thread while it holds the set-up lock)
        return parts

    monkeypatch.setattr(runtime_module, "Parts", interrupted)
    got: list[object] = []

    def compile_() -> None:
        try:
            rt.compile(safejit.Source("#define A 1\n", "a"))
        except safejit.SafejitError as exc:
            got.append(exc)

    worker = threading.Thread(target=compile_, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "close() from the wiring thread hung"
    assert len(got) == 1 and isinstance(got[0], safejit.LoadError)
    assert rt._wired is None  # (what was wired meanwhile was closed, not kept)


def test_two_threads_closing_at_once_write_one_usage_record(make_runtime, cache_dir):
    """close() from two threads at once: both wrote the usage record through the same
    temporary name, and one failed (a CacheError under on_cache_error='raise')."""
    rt = make_runtime(backend="fake")
    rt.compile(safejit.Source("#define A 1\n", "a"))
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def close() -> None:
        barrier.wait()
        try:
            rt.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=close) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    records = list((cache_dir / "v1" / "usage").rglob("*.json"))
    assert len(records) == 1


_CALLS_BACK = r"""
import faulthandler, logging, sys
import safejit
base = sys.argv[1]
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(base + "/cache", base + "/not-mounted-yet")))
src = safejit.Source("int f(int a) { return a + 1; }", "f")
heard = []

class Diagnose(logging.Handler):
    def emit(self, record):
        if heard:
            return
        heard.append(record.getMessage())
        try:
            rt.explain(src)
        except safejit.LoadError as exc:
            heard.append(str(exc))

logging.getLogger("safejit").addHandler(Diagnose(level=logging.WARNING))
faulthandler.dump_traceback_later(60, exit=True)
print(rt.compile(src).kernel("f")(1), len(heard) == 2 and "set up" in heard[1])
"""


def test_a_log_handler_that_calls_back_in_is_told_not_left_waiting(tmp_path):
    """A warning logged while a Runtime wires its parts (a cache root not there yet, as
    the README's example has) reached a handler that called back into that Runtime
    (``explain``): it waited for the lock its own thread held, for good. It is told (a
    ``LoadError``), and the compile goes on."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _CALLS_BACK, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["2", "True"], out.stdout
