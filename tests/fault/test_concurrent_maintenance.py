"""prune and gc running while 8 processes load kernels: no error, no wrong kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import safejit
from safejit.cache import maintenance
from tests.conftest import assert_cache_sound

LOADER = r"""
import json, sys, time
import safejit
cache, stop, progress = sys.argv[1], sys.argv[2], sys.argv[3]
import os
errors, calls = [], 0
while not os.path.exists(stop):
    for i in range(6):
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,)))
        try:
            got = rt.compile(safejit.Source(f"int k(void) {{ return {i * 11}; }}\n", "k")).kernel("k")()
            if got != i * 11:
                errors.append(f"kernel {i} returned {got}")
        except Exception as exc:  # any error is a failure of the test
            errors.append(repr(exc))
        finally:
            rt.close()
        calls += 1
        with open(progress, "a") as fh:
            fh.write("1")
print(json.dumps({"errors": errors, "calls": calls}))
"""


def test_prune_and_gc_while_eight_processes_load_cause_no_error_and_no_wrong_kernel(cache_dir, tmp_path):
    """Bounded by count and time: at least 6 rounds of prune and gc, and until every
    loader has made 6 calls (or 240 s passed, on a very loaded machine) — the
    assertions are on outcomes only, never on how much fitted in a window."""
    stop = tmp_path / "stop"
    progress = [tmp_path / f"progress-{i}" for i in range(8)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOADER, str(cache_dir), str(stop), str(progress[i])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]

    def calls(path: Path) -> int:
        return path.stat().st_size if path.exists() else 0

    try:
        deadline = time.monotonic() + 240
        rounds = gc_removed = 0
        residue = cache_dir / "v1" / "tmp"
        while time.monotonic() < deadline and (rounds < 6 or min(calls(p) for p in progress) < 6):
            # Old residue for gc to find; fresh staging dirs of the loaders must be left alone.
            if residue.is_dir():
                stale = residue / f"stale-{rounds}"
                stale.mkdir(exist_ok=True)
                (stale / "partial").write_text("x")
                os.utime(stale, (time.time() - 7200, time.time() - 7200))
            maintenance.prune(str(cache_dir), max_bytes=0, grace_s=0)
            counts = maintenance.gc(str(cache_dir), max_age_s=3600)
            gc_removed += counts["staging"]
            rounds += 1
            time.sleep(0.05)
        Path(stop).touch()
        reports = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        Path(stop).touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [r["errors"] for r in reports] == [[]] * 8
    assert all(r["calls"] > 0 for r in reports) and rounds >= 6 and gc_removed > 0
    assert_cache_sound(cache_dir)


def test_gc_spares_a_work_dir_a_compile_took_from_the_spares_made_long_before(tmp_path):
    """A spare work dir is made after a compile and taken by a later one, minutes on;
    gc judges a work dir's age by its mtime, so taking a spare makes it now (gc removed
    the work dir under a running compile, and the compile failed)."""
    import threading

    from safejit import faults
    from safejit.cache import staging

    cache = tmp_path / "c"
    with safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache),))) as rt:
        rt.compile(safejit.Source("#define A 1\n", "a"))
        staging.settle()  # (the spares made after it)
        old = time.time() - 3600
        for spare in (cache / "v1" / "tmp").iterdir():
            os.utime(spare, (old, old))  # (made an hour ago)
        done = threading.Event()
        removed: list[int] = []

        def gc_meanwhile() -> None:
            while not done.is_set():
                removed.append(maintenance.gc(str(cache), max_age_s=600)["staging"])
                time.sleep(0.02)

        sweeper = threading.Thread(target=gc_meanwhile)
        with faults.inject("compiler.spawn", "delay:0.5"):
            sweeper.start()
            try:
                mod = rt.compile(safejit.Source("#define B 2\n", "b"))
            finally:
                done.set()
                sweeper.join()
        assert mod.kernel("B")() == 2 and mod.artifact.tier == "compiled"
