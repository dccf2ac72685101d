"""CONTRACT test of the load-and-launch call sequence against a RECORDING
STAND-IN for CANN's ``acl`` module and ``libascendcl.so`` (no Ascend device or
CANN here). It pins which runtime calls are made, in which order, with which
arguments — not that a kernel runs."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

import safejit
from safejit.backends.ascend.launch import AscendKernel, AscendLibrary, _acl, pack_arguments


class RecordingRt:
    def __init__(self, calls):
        self.calls = calls

    def binary_load_from_data(self, data, size, options):
        self.calls.append(("binary_load_from_data", bytes(data[:4]), size, options))
        return 0x1000, 0

    def binary_get_function(self, handle, name):
        self.calls.append(("binary_get_function", handle, name))
        return 0x2000, 0

    def binary_unload(self, handle):
        self.calls.append(("binary_unload", handle))
        return 0


class RecordingAscendCL:
    def __init__(self, calls):
        self.calls = calls

    def aclrtLaunchKernelWithHostArgs(self, fn, num_blocks, stream, cfg, args, size, placeholders, count):
        self.calls.append(
            (
                "aclrtLaunchKernelWithHostArgs",
                fn.value,
                num_blocks.value,
                stream.value,
                cfg is not None,
                ctypes.string_at(args, size.value),
                size.value,
                placeholders,
                count.value,
            )
        )
        return 0


class FakeNpuStream:
    def __init__(self):
        self.reads = 0

    @property
    def npu_stream(self):
        self.reads += 1
        return 0x3000 + self.reads  # a fresh handle each read: it must be read right before each launch


def _library(calls):
    acl = types.SimpleNamespace(rt=RecordingRt(calls))
    return AscendLibrary(b"\x7fELF...", "op", ["add_custom"], acl=acl, ascendcl=RecordingAscendCL(calls))


def test_load_get_function_launch_unload_sequence():
    calls = []
    lib = _library(calls)
    assert calls == []  # nothing touches the runtime until a kernel is asked for
    argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_float]
    kernel = lib.function("add_custom", argtypes=argtypes)
    stream = FakeNpuStream()
    kernel.launch(8, (0xAA00, 0xBB00, 5, 1.5), stream=stream)
    kernel.launch(4, (0xAA00, 0xBB00, 6, 2.5), stream=stream, timeout_s=30)
    lib.close()
    lib.close()
    names = [c[0] for c in calls]
    assert names == [
        "binary_load_from_data",
        "binary_get_function",
        "aclrtLaunchKernelWithHostArgs",
        "aclrtLaunchKernelWithHostArgs",
        "binary_unload",
    ]
    assert calls[0][1:] == (b"\x7fELF", 7, 0) and calls[1] == ("binary_get_function", 0x1000, "add_custom")
    first, second = calls[2], calls[3]
    assert first[1:4] == (0x2000, 8, 0x3001) and second[1:4] == (0x2000, 4, 0x3002)  # stream re-read per launch
    assert first[4] is False and second[4] is True  # the timeout goes through a launch config
    assert first[5] == pack_arguments(argtypes, (0xAA00, 0xBB00, 5, 1.5)) and first[6] == 24
    assert calls[4] == ("binary_unload", 0x1000)


def test_torch_npu_current_stream_is_read_before_every_launch(monkeypatch):
    calls = []
    stream = FakeNpuStream()
    fake_torch = types.SimpleNamespace(npu=types.SimpleNamespace(current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    kernel = _library(calls).function("add_custom", argtypes=[ctypes.c_int32])
    kernel.launch(1, (1,))
    kernel.launch(1, (2,))
    assert [c[3] for c in calls if c[0] == "aclrtLaunchKernelWithHostArgs"] == [0x3001, 0x3002]


def test_unknown_kernel_and_missing_argtypes_are_typed_errors():
    lib = _library([])
    with pytest.raises(safejit.KernelNotFoundError):
        lib.function("nope", argtypes=[])
    with pytest.raises(safejit.ConfigError, match="argtypes"):
        lib.function("add_custom")


def test_only_scalars_and_device_pointers_are_packed():
    with pytest.raises(safejit.ConfigError):
        pack_arguments([ctypes.c_char_p], [b"x"])
    with pytest.raises(safejit.ConfigError):
        pack_arguments([ctypes.c_int8], [300])
    with pytest.raises(safejit.ConfigError):
        pack_arguments([ctypes.c_int32], ["1"])


def test_the_unrelated_pypi_pyacl_module_is_refused(monkeypatch):
    impostor = types.ModuleType("acl")  # PyPI 'pyacl' installs an access-control 'acl' module with no 'rt'
    impostor.__file__ = "/site-packages/acl/__init__.py"
    monkeypatch.setitem(sys.modules, "acl", impostor)
    with pytest.raises(safejit.LoadError, match="pyacl"):
        _acl()


def test_missing_cann_runtime_is_a_load_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "acl", None)
    with pytest.raises(safejit.LoadError, match="set_env"):
        _acl()


def test_a_python_module_named_acl_is_refused_before_any_of_its_code_runs(tmp_path, monkeypatch):
    """CANN's acl is an extension module; PyPI's 'pyacl' is Python source that was
    imported (its code run, and left in sys.modules) before being refused."""
    package = tmp_path / "acl"
    package.mkdir()
    ran = tmp_path / "ran"
    (package / "__init__.py").write_text(f"open({str(ran)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acl", raising=False)
    with pytest.raises(safejit.LoadError, match="pyacl"):
        _acl()
    assert not ran.exists() and "acl" not in sys.modules


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 2**32 + 1}, "num_blocks"),
        ({"num_blocks": True}, "num_blocks"),
        ({"num_blocks": 1, "timeout": 5}, "takes no"),
        ({"num_blocks": 1, "steam": 0}, "takes no"),
    ],
)
def test_a_launch_argument_that_would_be_wrapped_or_ignored_is_refused(kwargs, match):
    """ctypes wrapped 2**32 + 1 blocks to 1, and a misspelt keyword was swallowed."""
    kernel = AscendKernel("k", 1, [ctypes.c_int32], ascendcl=None)
    with pytest.raises(safejit.ConfigError, match=match):
        kernel.launch(args=[1], **kwargs)


@pytest.mark.parametrize(
    ("t", "value"),
    [(ctypes.c_void_p, 2**70), (ctypes.c_int32, 1.5), (ctypes.c_float, 10**400), (ctypes.c_float, 1e300)],
)
def test_a_value_its_parameter_cannot_hold_is_a_config_error(t, value):
    """A pointer of 2**70 became NULL, 1e300 for a float became inf, and the others raised
    raw TypeError / OverflowError."""
    with pytest.raises(safejit.ConfigError):
        pack_arguments([t], [value])


def test_a_tensor_in_host_memory_is_refused_as_a_device_pointer():
    """Anything with data_ptr() was taken for device memory: a CPU tensor's host address
    reached the kernel."""
    on = lambda kind: types.SimpleNamespace(data_ptr=lambda: 0x1000, device=types.SimpleNamespace(type=kind))  # noqa: E731
    with pytest.raises(safejit.ConfigError, match="'cpu'"):
        pack_arguments([ctypes.c_void_p], [on("cpu")])
    assert len(pack_arguments([ctypes.c_void_p], [on("npu")])) == 8
