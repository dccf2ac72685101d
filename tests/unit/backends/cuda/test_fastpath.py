"""The C launch path's parts that need no driver: its build, its plans, and that it
hands what it does not take to the Python path untouched."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

from safejit.backends.cuda import fastpath
from safejit.backends.cuda.args import native_plan
from safejit.sandbox import extensions
from safejit.sandbox.statedir import StateDir

CC = shutil.which("cc")
HEADERS = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
needs_build = pytest.mark.skipif(CC is None or not HEADERS, reason="no C compiler or no Python.h")


class _Tensor:
    def data_ptr(self) -> int:
        return 1


class _CupyLike:
    __cuda_array_interface__ = {"data": (1, False), "shape": (1,), "typestr": "<f4", "version": 3}

    class data:
        ptr = 1


def test_native_plans_name_each_arguments_type_and_reader():
    np = pytest.importorskip("numpy")
    params = [(0, 8), (8, 4), (12, 4), (16, 8), (24, 8), (32, 4), (36, 4)]
    args = (7, 1.5, 3, _Tensor(), _CupyLike(), np.float32(1), ctypes.c_int(2))
    assert native_plan(params, args) == (tuple(map(type, args)), (0, 1, 0, 2, 3, 4, 4))


@pytest.mark.parametrize(
    ("params", "args"),
    [
        ([(0, 2)], (1.5,)),  # a half-precision float: struct packs it, the C path does not
        ([(0, 4)], (_Tensor(),)),  # a pointer in a 4-byte slot
        ([(0, 16)], (1,)),  # no 16-byte int
        ([(0, 4)], ("1",)),
        ([(0, 4), (4, 4)], (1,)),  # too few
    ],
)
def test_no_native_plan_where_the_python_path_must_decide(params, args):
    assert native_plan(params, args) is None


def test_no_compiler_or_no_state_dir_builds_nothing(tmp_path):
    state = _state(tmp_path)
    assert extensions.load(fastpath.source(), fastpath.NAME, state, None) is None
    assert extensions.load(fastpath.source(), fastpath.NAME, None, CC or "cc") is None
    assert list(Path(state.shown).iterdir()) == []


def _state(path: Path) -> StateDir:
    private = path / "state"
    private.mkdir(mode=0o700)
    return StateDir(os.open(private, os.O_RDONLY | os.O_DIRECTORY), str(private))


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> StateDir:
    return _state(tmp_path_factory.mktemp("fastpath"))


@pytest.fixture(scope="module")
def fast(state: StateDir) -> ModuleType:
    if CC is None or not HEADERS:
        pytest.skip("no C compiler or no Python.h")
    module = extensions.load(fastpath.source(), fastpath.NAME, state, CC)
    assert module is not None
    return module


@needs_build
def test_the_extension_is_built_once_per_user_and_private(fast, state):
    (built,) = Path(state.shown).iterdir()
    before = built.stat()
    assert extensions.load(fastpath.source(), fastpath.NAME, state, CC) is not None
    assert list(Path(state.shown).iterdir()) == [built] and built.stat().st_mtime_ns == before.st_mtime_ns
    assert before.st_uid == os.geteuid() and not before.st_mode & 0o022
    assert built.name.startswith(f"{fastpath.NAME}-{sys.implementation.cache_tag}-") and built.suffix == ".so"


@needs_build
def test_an_unplanned_or_unusual_call_goes_to_the_python_path_untouched(fast):
    state = fast.new_state(0x1000, ((0, 8), (8, 4)))
    calls = []

    def slow(*args, **kwargs):
        calls.append((args, kwargs))
        return "slow"

    launch = fast.launcher(state, slow)
    assert launch((1,), (32,), (5, 1.0), stream=3) == "slow"  # no plan yet
    fast.set_plan(state, (int, float), (0, 1))
    marker = object()
    assert launch((1,), (32,), (5, 1.0), shared_mem=0, stream=marker) == "slow"  # unconfigured: no driver
    assert launch(grid=1, block=2, args=[1, 2.0], cluster=(2, 1, 1), extra=1) == "slow"
    fast.close(state)
    assert launch((1,), (32,), (5, 1.0)) == "slow"
    assert calls == [
        (((1,), (32,), (5, 1.0)), {"stream": 3}),
        (((1,), (32,), (5, 1.0)), {"shared_mem": 0, "stream": marker}),
        ((), {"grid": 1, "block": 2, "args": [1, 2.0], "cluster": (2, 1, 1), "extra": 1}),
        (((1,), (32,), (5, 1.0)), {}),
    ]


@needs_build
@pytest.mark.parametrize(
    ("layout", "types", "kinds"),
    [
        (((0, 4),), (int,), (2,)),  # a pointer in 4 bytes
        (((0, 2),), (float,), (1,)),  # a half float
        (((0, 16),), (int,), (0,)),  # a 16-byte int
        (((0, 4),), (int,), (9,)),  # no such kind
        (((0, 4),), (1,), (0,)),  # not a type
        (((0, 4), (4, 4)), (int,), (0,)),  # too few
    ],
)
def test_plans_the_c_path_cannot_follow_are_refused(fast, layout, types, kinds):
    with pytest.raises(ValueError, match="plan"):
        fast.set_plan(fast.new_state(1, layout), types, kinds)


@needs_build
def test_layouts_past_the_c_paths_buffer_are_refused(fast):
    with pytest.raises(ValueError, match="parameter"):
        fast.new_state(1, ((4090, 8),))
    with pytest.raises(ValueError, match="parameters"):
        fast.new_state(1, tuple((i * 4, 4) for i in range(129)))
