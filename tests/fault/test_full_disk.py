"""A full cache disk: a real tmpfs of 300 KiB, the compiler's scratch in the cache root
(``scratch="cache"``), and the host compiler (whose own scratch files were what failed).

Whatever runs out of room — a work dir, the compiler's object or link output, the
staged leaf, a lock file — a compile either works or raises ``CacheError`` carrying
the errno: never a bare ``OSError``, never a ``CompileError`` for a valid source. Under
``on_cache_error="bypass"`` it always returns a working kernel. The cache stays sound.
(Before, about half of such compiles raised a bare OSError or a CompileError, and
bypass did not bypass.) Skipped where this process may not mount a tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import safejit
from safejit.cache.staging import settle
from tests.conftest import assert_cache_sound
from tests.fault._support import child_env, leave_free, small_tmpfs, staging_entries

SIZE_KIB = 300
#: Free space left for each compile, in KiB: from none, through "the compiler's output
#: does not fit", "the staged leaf does not fit", to plenty.
FREE_KIB = (0, 4, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 96, 160)
#: What a full filesystem can report.
FULL = (errno.ENOSPC, errno.EDQUOT)


def _source(i: int) -> safejit.Source:
    return safejit.Source(f"int k(void) {{ return {i}; }}\n", "k")


def _sweep(rt: safejit.Runtime, mount: Path) -> list[str]:
    """Compile a new kernel with each amount of free space; each outcome in words."""
    outcomes = []
    for i, kib in enumerate(FREE_KIB, start=1):
        settle()  # (the last compile's work dir, removed in the background, is gone before the disk is filled)
        leave_free(mount, kib)
        try:
            value = rt.compile(_source(i)).kernel("k")()
        except safejit.CacheError as exc:
            assert exc.errno in FULL, f"{kib} KiB free: {exc!r}"
            outcomes.append("cache-error")
            continue
        assert value == i, f"{kib} KiB free: kernel {i} returned {value}"
        outcomes.append("ok")
    return outcomes


@pytest.fixture
def full_disk(tmp_path: Path):
    with small_tmpfs(tmp_path / "small", SIZE_KIB) as mount:
        yield mount, mount / "cache"


def _finish(mount: Path, cache: Path) -> None:
    (mount / "filler").unlink(missing_ok=True)
    settle()
    assert staging_entries(cache) == []
    assert_cache_sound(cache)


def test_compile_on_a_full_cache_disk_works_or_raises_cache_error_with_errno(full_disk, make_runtime):
    mount, cache = full_disk
    leave_free(mount, 0)
    with pytest.raises(safejit.CacheError) as info:  # a first compile of a fresh process
        make_runtime(cache_dirs=(str(cache),), scratch="cache").compile(_source(0))
    assert info.value.errno in FULL
    (mount / "filler").unlink()
    rt = make_runtime(cache_dirs=(str(cache),), scratch="cache")
    assert rt.compile(_source(0)).kernel("k")() == 0  # the cache in use, then filling up
    outcomes = _sweep(rt, mount)
    # Both happened: the disk was really full, and compiles work again once there is room.
    assert "cache-error" in outcomes and outcomes[-1] == "ok", list(zip(FREE_KIB, outcomes, strict=True))
    assert rt.stats()["bypass"] == 0
    _finish(mount, cache)


def test_compile_on_a_full_cache_disk_under_bypass_always_returns_a_working_kernel(full_disk, make_runtime):
    mount, cache = full_disk
    leave_free(mount, 0)
    first = make_runtime(cache_dirs=(str(cache),), scratch="cache", on_cache_error="bypass")
    assert first.compile(_source(0)).kernel("k")() == 0  # a first compile of a fresh process
    (mount / "filler").unlink()
    rt = make_runtime(cache_dirs=(str(cache),), scratch="cache", on_cache_error="bypass")
    assert rt.compile(_source(0)).kernel("k")() == 0
    assert set(_sweep(rt, mount)) == {"ok"}
    assert rt.stats()["bypass"] > 0  # the full disk was met, and bypassed
    _finish(mount, cache)


CHILD = r"""
import json, sys
import safejit
cache, mode, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(cache,), scratch="cache", on_cache_error=mode))
out = []
for i in range(first, first + 5):
    try:
        got = rt.compile(safejit.Source(f"int k(void) {{ return {i}; }}\n", "k")).kernel("k")()
        out.append("ok" if got == i else f"wrong {got} for {i}")
    except safejit.CacheError as exc:
        out.append(f"cache-error {exc.errno}")
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


def test_compiles_of_several_processes_filling_the_cache_disk_work_or_raise_cache_error(full_disk):
    """Three fresh processes (each sets up what a first compile needs, on the full disk)
    compile five kernels each into the last 64 KiB at once."""
    mount, cache = full_disk
    cache.mkdir()
    leave_free(mount, 64)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(cache), "raise", str(100 * n)],
            env=child_env(None),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(1, 4)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        outcomes += json.loads(out.strip().splitlines()[-1])
    assert set(outcomes) <= {"ok", *(f"cache-error {e}" for e in FULL)}, outcomes
    assert any(o.startswith("cache-error") for o in outcomes), outcomes  # the disk did fill up
    _finish(mount, cache)


def test_compile_of_a_broken_source_on_a_nearly_full_cache_disk_is_a_compile_error(full_disk, make_runtime):
    """The other side of the rule: a source that does not compile is the caller's error
    (``CompileError``, with the compiler's log), full disk or not."""
    mount, cache = full_disk
    rt = make_runtime(cache_dirs=(str(cache),), scratch="cache")
    assert rt.compile(_source(0)).kernel("k")() == 0
    leave_free(mount, 40)  # room for this compile's scratch files, little more
    try:
        with pytest.raises(safejit.CompileError) as info:
            rt.compile(safejit.Source("int k(void) { return 1 +; }\n", "k"))
    finally:
        (mount / "filler").unlink()
    assert not isinstance(info.value, safejit.CacheError), info.value
    _finish(mount, cache)


FULL_SHM_CHILD = r"""
import json, os, sys
import safejit
from tests.fault._support import leave_free
from pathlib import Path
results = []
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],), scratch="memory"))
for i, kib in enumerate((0, 8, 24, 0), start=1):
    leave_free(Path("/dev/shm"), kib)
    try:
        mod = rt.compile(safejit.Source(f"int k(void) {{ return {i}; }}\n", "k"))
        results.append([mod.kernel("k")(), str(mod.artifact.tier)])
    except Exception as exc:
        results.append([type(exc).__name__, str(exc)[:300]])
stats = rt.stats()
print(json.dumps([results, stats["compiles"], stats["errors"]]))
"""


def test_a_full_dev_shm_makes_compiles_work_in_the_cache_root(tmp_path):
    """The compiler's scratch is in memory by default; with /dev/shm full (64 MB in a
    container, filled by data loaders) writing the source there failed, and every cold
    compile raised CacheError("the disk cache cannot be used") — under bypass nothing
    was cached — though the cache disk had room. Such a compile now works in the cache
    root, and so does every later one. (A private mount namespace: this machine's own
    /dev/shm is left alone; skipped where one cannot be made.)"""
    cache = tmp_path / "cache"
    out = _with_a_small_dev_shm(FULL_SHM_CHILD, cache)
    results, compiles, errors = json.loads(out.stdout)
    assert results == [[i, "compiled"] for i in range(1, 5)], out.stderr
    assert (compiles, errors) == (4, 0)  # (a compile run again is one compile, and no error)
    assert_cache_sound(cache)
    assert "compiling in the cache root" in out.stderr


def _with_a_small_dev_shm(child: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """``child`` run (given ``cache``) in a private mount namespace whose /dev/shm is a
    256 KiB tmpfs: this machine's own is left alone. Skipped where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs over /dev/shm needs root")
    script = (
        "mount --make-rprivate / && mount -t tmpfs -o size=256k,mode=1777 tmpfs /dev/shm && "
        f'exec {sys.executable} -c "$0" "$1"'
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, child, str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")},
        cwd=Path(__file__).parents[2],
    )
    if out.returncode and "mount" in out.stderr and "safejit" not in out.stderr:
        pytest.skip(f"cannot mount a tmpfs over /dev/shm here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    return out


BAD_ASM_CHILD = r"""
import json, sys
import safejit
from tests.fault._support import leave_free
from pathlib import Path
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],), scratch="memory"))
leave_free(Path("/dev/shm"), 32)
try:
    rt.compile(safejit.Source('__asm__(".bogus_directive");\nint k(void) { return 1; }\n', "k"))
except safejit.CompileError as exc:
    said = str(exc)
stats = rt.stats()
print(json.dumps([said, stats["compiles"], stats["errors"]]))
"""


def test_an_assemblers_error_on_a_nearly_full_dev_shm_is_the_sources(tmp_path):
    """An assembler's error names no line of a source: with /dev/shm nearly full it was
    taken for the scratch's failure, the compile run twice and memory scratch given up
    for the process. Only the compiler saying there is no room moves it."""
    out = _with_a_small_dev_shm(BAD_ASM_CHILD, tmp_path / "cache")
    said, compiles, errors = json.loads(out.stdout)
    assert "bogus_directive" in said and (compiles, errors) == (1, 1)
    assert "compiling in the cache root" not in out.stderr
