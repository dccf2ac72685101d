"""The Landlock numbers have one home (safejit.sandbox.landlock); the standalone
Python shim and the C shim keep copies, pinned here."""

from __future__ import annotations

import re
from importlib import resources

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
