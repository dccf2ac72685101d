"""Helpers shared by the fault tests: the kernels, child processes that
compile under ``SAFEJIT_FAULTS``, the ``safejit verify`` command and the
"nothing half-written is visible" checks every fault test ends with."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import safejit
from safejit.cache.layout import VERSION as LAYOUT
from tests.conftest import ADD_C, leaves, staging_residue

#: The leaf every seeded cache already holds before a fault test starts.
EARLIER_NAME, EARLIER_C = "add", ADD_C
#: What a fault test compiles: a different source, so a different build key.
NEW_NAME, NEW_C = "mul", "int mul(int a, int b) { return a * b; }\n"
#: Both kernels are called with (6, 7).
EXPECTED = {EARLIER_NAME: 13, NEW_NAME: 42}
SIGKILLED = -signal.SIGKILL
T = TypeVar("T")

#: A process that compiles one kernel into one cache root and prints its value at (6, 7).
CHILD = """
import sys
import safejit

cache, name, code, lock_timeout = sys.argv[1:5]
cfg = safejit.Config.from_env().replace(cache_dirs=(cache,), lock_timeout_s=float(lock_timeout))
rt = safejit.Runtime(config=cfg)
mod = rt.compile(safejit.Source(code, name))
print(mod.kernel(name)(6, 7), mod.artifact.source, flush=True)
"""


def child_argv(cache: Path, name: str, code: str, *, lock_timeout: float = 600.0) -> list[str]:
    return [sys.executable, "-c", CHILD, str(cache), name, code, str(lock_timeout)]


def child_env(faults: str | None, scratch: str = "cache") -> dict[str, str]:
    """The child's environment. Its compiler works in the cache root (``scratch="cache"``)
    unless told otherwise, so what a killed child left is all under ``<cache>/v1/tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env["SAFEJIT_SCRATCH"] = scratch
    if faults:
        env["SAFEJIT_FAULTS"] = faults
    return env


def run_child(
    cache: Path, name: str, code: str, *, faults: str | None, scratch: str = "cache"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        child_argv(cache, name, code),
        env=child_env(faults, scratch),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start_child(
    cache: Path, name: str, code: str, *, faults: str | None, scratch: str = "cache"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        child_argv(cache, name, code),
        env=child_env(faults, scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_and_reap(proc: subprocess.Popen[str]) -> int:
    """SIGKILL a child (if still running) and return its exit status."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    return proc.returncode


def wait_for(condition: Callable[[], T], *, timeout: float = 20.0, proc: subprocess.Popen[str] | None = None) -> T:
    """Poll ``condition`` until it is truthy; fail if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"child exited with {proc.returncode} before the condition held:\n{out}\n{err}")
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout}s")


def run_verify(cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m safejit verify --cache-dir CACHE`` (wide console: one line per failure)."""
    env = {**child_env(None), "COLUMNS": "4000", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "safejit", "verify", "--cache-dir", str(cache), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


#: The ``make_runtime`` fixture.
MakeRuntime = Callable[..., safejit.Runtime]


def snapshot(leaf: str | Path) -> dict[str, bytes]:
    """Every file of a leaf, by name."""
    return {p.name: p.read_bytes() for p in sorted(Path(leaf).iterdir())}


def leaf_paths(cache: Path) -> set[str]:
    return {info.path for info in leaves(cache)}


def only_leaf(cache: Path) -> str:
    (path,) = leaf_paths(cache)
    return path


def staging_entries(cache: Path) -> list[str]:
    """What is left under ``<cache>/v1/tmp`` (staging and compile work dirs), unused spares aside."""
    return staging_residue(cache)


def quarantined(cache: Path) -> list[str]:
    qdir = cache / LAYOUT / "quarantine"
    return sorted(os.listdir(qdir)) if qdir.is_dir() else []


def _mount(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *argv], capture_output=True, text=True, timeout=30, check=False)


def _unmount(path: Path) -> None:
    from safejit.cache.staging import settle

    settle()  # (background deletes of this process still working in it)
    if subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


@contextlib.contextmanager
def small_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` KiB mounted at ``path`` for the block; the test is skipped
    where this process may not mount one (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path))
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def read_only_bind(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted onto itself read-only for the block (skipped where this
    process may not mount)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    done = _mount("--bind", str(path), str(path))
    if done.returncode:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        done = _mount("-o", "remount,bind,ro", str(path))
        if done.returncode:
            pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
        yield path
    finally:
        _unmount(path)


def leave_free(mount: Path, kib: int, filler_name: str = "filler") -> int:
    """Fill the filesystem at ``mount`` with a filler file until about ``kib`` KiB are
    left; returns the KiB then free."""
    filler = mount / filler_name
    filler.write_bytes(b"")
    st = os.statvfs(mount)
    want = max(0, st.f_bavail * st.f_frsize - kib * 1024)
    with contextlib.suppress(OSError), open(filler, "wb") as fh:  # (ENOSPC: as full as it gets)
        fh.write(b"\0" * want)
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize // 1024
