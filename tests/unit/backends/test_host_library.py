"""Loading host artifacts from bytes (``backends._host_library``): each load is its own
library, whatever descriptor number its memfd had, and loading makes no file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from safejit.backends._host_library import HostLibrary, _unique_name

CC = shutil.which("cc") or ""
pytestmark = pytest.mark.skipif(not CC, reason="no C compiler")


def _shared_object(tmp: Path, value: int) -> bytes:
    src, out = tmp / f"v{value}.c", tmp / f"v{value}.so"
    src.write_text(f"int value(void) {{ return {value}; }}\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


def test_libraries_loaded_one_after_another_are_each_their_own(tmp_path):
    """Each memfd is closed once loaded, so the next one gets the same descriptor
    number: loaded by the name /proc/self/fd/N, the dynamic loader handed back the
    first library for every later one (the bytes verified were not the code run)."""
    libs = [HostLibrary(_shared_object(tmp_path, v), f"v{v}") for v in (1, 2, 3)]
    assert [lib.function("value")() for lib in libs] == [1, 2, 3]


def test_a_second_copy_of_the_module_loads_libraries_of_its_own(tmp_path):
    """A subinterpreter, a reload or a vendored copy has a module of its own: a counter
    kept in the module started again at 1 there, and its first load got the first
    copy's library by that name."""
    import importlib.util

    from safejit.backends import _host_library

    spec = importlib.util.spec_from_file_location("safejit.backends._host_library_twin", _host_library.__file__)
    assert spec is not None and spec.loader is not None
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    first = HostLibrary(_shared_object(tmp_path, 1), "one")
    second = twin.HostLibrary(_shared_object(tmp_path, 2), "two")
    assert (first.function("value")(), second.function("value")()) == (1, 2)


def test_the_names_differ_for_every_load_and_reach_the_descriptor(tmp_path):
    names = {_unique_name(7) for _ in range(300)}
    assert len(names) == 300
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        (tmp_path / "here").write_text("")
        assert os.path.samefile(_unique_name(fd), tmp_path)
    finally:
        os.close(fd)


LOADS_IN_A_FORKED_CHILD = r"""
import os, sys
from safejit.backends._host_library import HostLibrary
one, two = (open(p, "rb").read() for p in sys.argv[1:3])
first = HostLibrary(one, "one")
pid = os.fork()
if pid == 0:  # (the parent's library is loaded in the child too, by the name it had)
    second = HostLibrary(two, "two")
    os._exit(0 if (first.function("value")(), second.function("value")()) == (1, 2) else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), first.function("value")())
"""


def test_a_forked_child_loads_its_own_libraries_beside_those_it_inherited(tmp_path):
    paths = []
    for v in (1, 2):
        path = tmp_path / f"{v}.so"
        path.write_bytes(_shared_object(tmp_path, v))
        paths.append(str(path))
    out = subprocess.run(
        [sys.executable, "-c", LOADS_IN_A_FORKED_CHILD, *paths], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]


def test_loading_makes_no_file_in_the_temporary_dirs(tmp_path):
    def entries() -> set[str]:
        return {
            os.path.join(where, name)
            for where in dict.fromkeys((tempfile.gettempdir(), "/dev/shm"))
            if os.path.isdir(where)
            for name in os.listdir(where)
        }

    artifact = _shared_object(tmp_path, 5)
    before = entries()
    lib = HostLibrary(artifact, "five")
    assert lib.function("value")() == 5
    assert entries() - before == set()
