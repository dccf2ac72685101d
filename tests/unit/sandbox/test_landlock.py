"""The Landlock numbers have one home (safejit.sandbox.landlock); the standalone
Python shim and the C shim keep copies, pinned here."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from safejit.sandbox import _pyshim, landlock


def test_the_python_shim_uses_the_same_numbers_and_masks() -> None:
    text = resources.files("safejit.sandbox").joinpath("_pyshim.py").read_text()
    assert f"_sys({landlock.SYS_CREATE_RULESET}," in text
    assert f"_sys({landlock.SYS_ADD_RULE}," in text
    assert f"_sys({landlock.SYS_RESTRICT_SELF}," in text
    assert landlock.READ_EXECUTE == _pyshim._READ_X
    assert landlock.FS_FILE_RIGHTS == _pyshim._FS_FILE


def test_the_c_shim_uses_the_same_numbers_and_masks() -> None:
    text = resources.files("safejit.sandbox").joinpath("shim.c").read_text()
    defines = dict(re.findall(r"#define (\w+) \(?([^\n/]*?)\)?\s*(?:/\*.*)?\n", text))
    assert int(defines["SYS_ll_create"]) == landlock.SYS_CREATE_RULESET
    assert int(defines["SYS_ll_add"]) == landlock.SYS_ADD_RULE
    assert int(defines["SYS_ll_restrict"]) == landlock.SYS_RESTRICT_SELF
    bits = {
        "FS_EXECUTE": landlock.FS_EXECUTE,
        "FS_WRITE_FILE": landlock.FS_WRITE_FILE,
        "FS_READ_FILE": landlock.FS_READ_FILE,
        "FS_READ_DIR": landlock.FS_READ_DIR,
        "FS_REFER": landlock.FS_REFER,
        "FS_TRUNCATE": landlock.FS_TRUNCATE,
        "FS_IOCTL_DEV": landlock.FS_IOCTL_DEV,
        "NET_BIND_TCP": landlock.NET_BIND_TCP,
        "NET_CONNECT_TCP": landlock.NET_CONNECT_TCP,
        "SCOPE_ABSTRACT_UNIX_SOCKET": landlock.SCOPE_ABSTRACT_UNIX_SOCKET,
        "SCOPE_SIGNAL": landlock.SCOPE_SIGNAL,
    }
    for name, value in bits.items():
        shift = re.fullmatch(r"1ULL << (\d+)", defines[name])
        assert shift is not None and 1 << int(shift.group(1)) == value, name
    assert defines["FS_ALL_V1"] == "(1ULL << 13) - 1" and landlock.FS_ALL_V1 == (1 << 13) - 1


_THREADED = r"""
import os, sys, threading
from safejit.sandbox import landlock
go, done, seen = threading.Event(), threading.Event(), []
def other():  # a thread started before the restriction, reading after it
    go.wait()
    try:
        seen.append(open(sys.argv[2]).read())
    except OSError as exc:
        seen.append(type(exc).__name__)
    done.set()
if sys.argv[3] == "threaded":
    threading.Thread(target=other, daemon=True).start()
try:
    print("applied" if landlock.restrict([], [], deny_net=True, required=sys.argv[1] == "required") else "not applied")
except landlock.LandlockError as exc:
    print("refused:", exc)
try:
    print("this thread read", open(sys.argv[2]).read())
except OSError as exc:
    print("this thread", type(exc).__name__)
go.set()
if sys.argv[3] == "threaded":
    done.wait(10)
    print("the other thread read", seen[0])
"""


def _run(mode: str, threads: str, outside: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _THREADED, mode, str(outside), threads], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(landlock.abi() == 0, reason="this kernel offers no Landlock")
def test_a_required_restriction_of_a_process_running_other_threads_is_refused(tmp_path) -> None:
    """landlock_restrict_self binds only the calling thread: with another thread running
    (a pool a library started), a required restriction is refused and nothing changes."""
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    out = _run("required", "threaded", outside)
    assert out == [
        "refused: this process runs other threads, which Landlock would leave unconfined",
        "this thread read x",
        "the other thread read x",
    ]


@pytest.mark.skipif(landlock.abi() == 0, reason="this kernel offers no Landlock")
def test_best_effort_restricts_the_calling_thread_only(tmp_path) -> None:
    """Why the refusal: best effort restricts this thread, and the other still reads."""
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    out = _run("best-effort", "threaded", outside)
    assert out == ["applied", "this thread PermissionError", "the other thread read x"]


@pytest.mark.skipif(landlock.abi() == 0, reason="this kernel offers no Landlock")
def test_a_single_threaded_process_is_restricted_when_required(tmp_path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    assert _run("required", "single", outside) == ["applied", "this thread PermissionError"]
