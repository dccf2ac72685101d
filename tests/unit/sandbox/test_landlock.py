"""The Landlock numbers have one home (safejit.sandbox.landlock); the standalone
Python shim and the C shim keep copies, pinned here."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources

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
gate = threading.Event()
threading.Thread(target=gate.wait, daemon=True).start()  # another thread, running
try:
    applied = landlock.restrict([], [], deny_net=True, required=sys.argv[1] == "required")
    print("applied" if applied else "not applied")
except landlock.LandlockError as exc:
    print("refused:", exc)
with open(sys.argv[2]) as fh:  # read anywhere still: nothing was restricted
    print("read", fh.read())
gate.set()
"""


@pytest.mark.skipif(landlock.abi() == 0, reason="this kernel offers no Landlock")
@pytest.mark.parametrize("mode", ["required", "best-effort"])
def test_a_process_running_other_threads_is_not_restricted_halfway(tmp_path, mode) -> None:
    """landlock_restrict_self binds only the calling thread: with another thread running
    (a pool a library started), restrict refuses (required) or applies nothing and says
    so; the process, every thread of it, is left as it was."""
    outside = tmp_path / "outside.txt"
    outside.write_text("still readable")
    out = subprocess.run(
        [sys.executable, "-c", _THREADED, mode, str(outside)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    said = "refused: this process runs other threads" if mode == "required" else "not applied"
    assert out[0].startswith(said) and out[1] == "read still readable", out


@pytest.mark.skipif(landlock.abi() == 0, reason="this kernel offers no Landlock")
def test_a_single_threaded_process_is_restricted(tmp_path) -> None:
    """The control: the same script with no other thread is restricted, and the read fails."""
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    script = _THREADED.replace("threading.Thread(target=gate.wait, daemon=True).start()", "pass")
    done = subprocess.run([sys.executable, "-c", script, "required", str(outside)], capture_output=True, text=True)
    assert done.stdout.splitlines()[0] == "applied" and done.returncode != 0 and "PermissionError" in done.stderr
