"""The flag tables themselves: each backend names a family; the tables hold exact
spellings only; bisheng's (Ascend, whose toolkit is not here) takes and refuses what
its comments say. The other families are tested through Runtime.compile in
tests/security."""

from __future__ import annotations

import re

import pytest

import safejit
from safejit.backends.ascend.backend import AscendBackend
from safejit.backends.host import HostBackend
from safejit.policy.flag_tables import FAMILIES, LINKER, LINKER_NEXT, PTXAS
from safejit.policy.flags import check_flags


def _anchor(path: str, what: str) -> str:
    return "\0s0\0/" + path.lstrip("/")


def test_each_backend_names_a_family():
    from safejit.backends.cuda.backend import CudaBackend

    assert HostBackend.flag_family == "gcc"
    assert AscendBackend.flag_family == "bisheng"
    assert CudaBackend(compiler="nvcc").flag_family == "nvcc"
    assert CudaBackend(compiler="nvrtc").flag_family == "nvrtc"
    assert set(FAMILIES) == {"gcc", "nvcc", "nvrtc", "bisheng"}


def test_an_unknown_family_is_a_config_error():
    with pytest.raises(safejit.ConfigError):
        check_flags(["-O2"], _anchor, family="icc")


#: No table entry holds anything a shell, a comma-splitting driver or a path could use.
_ENTRY = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_+.=-]*\Z")


@pytest.mark.parametrize("name", FAMILIES)
def test_tables_hold_plain_exact_spellings(name):
    fam = FAMILIES[name]
    for entry in [*fam.options.exact, *fam.options.valued, *fam.machine]:
        assert _ENTRY.match(entry), entry
    for entry in [*LINKER.exact, *LINKER.valued, *LINKER_NEXT, *PTXAS.exact, *PTXAS.valued]:
        assert _ENTRY.match(entry), entry
    # A valued name is a whole option name and its joiner: never a bare family prefix.
    assert not {"-f", "-m", "-X", "-Wl,", "--"} & set(fam.options.valued)
    if name == "gcc":  # (loaded into this process: see the load-time cases)
        assert not {"-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-fsanitize=address"} & fam.options.exact


BISHENG_ADMITS = [
    ["--cce-auto-sync"],
    ["-O2", "-std=c++17", "--std=c++17", "-Wall", "-Wno-unused", "-w", "-g"],
    ["-DTILE=64", "-UNDEBUG", "-D", "X"],
    ["-I", "/op/include", "-isystem/op/sys", "-include", "/op/tile.h"],
    ["-fno-exceptions", "-fno-rtti", "-ffast-math"],
]
BISHENG_REFUSES = {
    "sync-log": ["--cce-auto-sync-log=/tmp/x"],
    "mllvm": ["-mllvm", "-info-output-file=/tmp/x"],
    "arch": ["--cce-aicore-arch=dav-c220"],
    "npu-arch": ["--npu-arch=dav-2201"],
    "aicore-only": ["--cce-aicore-only"],
    "language": ["-xcce"],
    "march-native": ["-march=native"],
    "library": ["-lm"],
    "linker": ["-Wl,-z,now"],
    "sanitize": ["-fsanitize=address"],
    "output": ["-o", "/tmp/x"],
    "plugin": ["-fplugin=x.so"],
    "response-file": ["@/tmp/x"],
    "sysroot": ["--sysroot=/"],
    "soc-version": ["--cce-soc-version=Ascend910B"],
    "shared": ["--shared"],
}


@pytest.mark.parametrize("flags", BISHENG_ADMITS)
def test_bisheng_admits(flags):
    out = check_flags(flags, _anchor, family="bisheng")
    assert len(out) <= len(flags)


@pytest.mark.parametrize("flags", BISHENG_REFUSES.values(), ids=BISHENG_REFUSES.keys())
def test_bisheng_refuses(flags):
    with pytest.raises(safejit.FlagPolicyError) as exc:
        check_flags(flags, _anchor, family="bisheng")
    assert exc.value.flag == flags[0]


def test_path_flags_are_anchored_and_macros_joined():
    out = check_flags(["-I", "/a", "-isystem/b", "-D", "X=1", "-U", "Y", "-O2"], _anchor, family="gcc")
    assert out == ("-I\0s0\0/a", "-isystem\0s0\0/b", "-DX=1", "-UY", "-O2")
    assert check_flags(["-I", "/a"], _anchor, family="nvcc") == ("-I\0s0\0/a",)
    with pytest.raises(safejit.FlagPolicyError):
        check_flags(["-iquote", "/a"], _anchor, family="nvcc")  # (nvcc knows no -iquote)
    with pytest.raises(safejit.FlagPolicyError):
        check_flags(["-I", "/a"], _anchor, family="nvrtc")  # (headers are handed over in memory)


def test_ptxas_lists_are_nvccs_only():
    assert check_flags(["-Xptxas=-v,-O3"], _anchor, family="nvcc") == ("-Xptxas=-v,-O3",)
    with pytest.raises(safejit.FlagPolicyError):
        check_flags(["-Xptxas=-v,-O3"], _anchor, family="nvrtc")
    assert check_flags(["--ptxas-options=-maxrregcount=64"], _anchor, family="nvrtc")
