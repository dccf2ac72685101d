"""Compiler errors point at the user's files: the compiler sees a scratch copy of the
source in a work dir; its log and the CompileError's message name the source as the
user knows it (its origin for a file, its file name otherwise), and never the work dir."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

import safejit
from safejit.backends._compilerlog import user_paths

BAD = "int f(void) {\n  return 1\n}\n"


def _error(rt: safejit.Runtime, source: safejit.Source) -> safejit.CompileError:
    with pytest.raises(safejit.CompileError) as info:
        rt.compile(source)
    return info.value


def _scratch(error: safejit.CompileError) -> str:
    """The work dir the compiler ran in (its argv, which is what ran, keeps it)."""
    src = next(a for a in error.argv if a.endswith((".c", ".cpp", ".cu")))
    return src.rsplit("/src/", 1)[0]


def test_a_syntax_error_in_a_file_names_the_file(make_runtime, tmp_path):
    root = tmp_path / "mylib"
    (root / "src").mkdir(parents=True)
    (root / "src" / "bad.c").write_text(BAD)
    rt = make_runtime(source_roots=(str(root),))
    error = _error(rt, rt.source(root / "src" / "bad.c"))
    where = f"{root}/src/bad.c:2:11: error: expected ';' before '}}' token"
    assert where in error.log and where in str(error)
    workdir = _scratch(error)
    assert workdir not in error.log and workdir not in str(error)


def test_a_syntax_error_in_an_inline_source_names_its_file_name(make_runtime):
    rt = make_runtime()
    for source, shown in (
        (safejit.Source(BAD, "inline"), "inline.c"),
        (safejit.Source(BAD, "k", filename="k.cpp"), "k.cpp"),
    ):
        error = _error(rt, source)
        assert error.log.startswith(f"{shown}: In function") and f"\n{shown}:2:11: error:" in error.log
        assert _scratch(error) not in error.log


@pytest.mark.skipif(
    shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin") is None or importlib.util.find_spec("cuda") is None,
    reason="no nvcc",
)
def test_an_nvcc_error_names_the_file(make_runtime, tmp_path):
    """nvcc's argv runs through the same staging as the host's (and Ascend's)."""
    root = tmp_path / "cuproj"
    root.mkdir()
    (root / "bad.cu").write_text('extern "C" __global__ void k(float* x) {\n  x[0] = 1\n}\n')
    rt = make_runtime(backend="cuda", cuda_compiler="nvcc", source_roots=(str(root),))
    with pytest.raises(safejit.CompileError) as info:
        rt.compile(rt.source(root / "bad.cu"), arch="sm_90")
    assert f"{root}/bad.cu(3): error" in info.value.log
    assert _scratch(info.value) not in info.value.log and "/src/bad.cu" not in info.value.log


def test_what_else_names_the_work_dir_loses_it():
    shown = (("/w/p1/src/k.c", "/home/me/k.c"), ("./src/k.c", "/home/me/k.c"), ("/w/p1/", ""), ("/w/p1", "."))
    log = "/w/p1/src/k.c:1: error\nld: /w/p1/k.so: ./src/k.c:3: undefined\ncd /w/p1\n"
    assert user_paths(log, shown) == "/home/me/k.c:1: error\nld: k.so: /home/me/k.c:3: undefined\ncd .\n"
    assert user_paths("nothing to map", shown) == "nothing to map"


def test_a_header_not_found_is_named_with_the_dirs_searched(make_runtime, tmp_path):
    """A header that is not there: the message names it and every include dir searched,
    in order (the caller's first, then the toolchain's); an error of another kind
    lists none."""
    inc = tmp_path / "inc"
    inc.mkdir()
    rt = make_runtime(source_roots=(str(inc),))
    for directive in ("<nothere.h>", '"nothere.h"'):
        with pytest.raises(safejit.CompileError) as info:
            rt.compile(
                safejit.Source(f"#include {directive}\nint f(void) {{ return 1; }}\n", "f"), include_dirs=(str(inc),)
            )
        error = info.value
        message = str(error)
        assert "nothere.h: not found" in message
        searched = message.split("include dirs searched, in order")[1].splitlines()[1:]
        dirs = [line.strip() for line in searched]
        assert dirs[0] == str(inc) and "/usr/include" in dirs, message
        assert "include dirs searched" not in error.log  # (the compiler's own words, as it said them)
    assert "include dirs searched" not in str(_error(rt, safejit.Source(BAD, "g")))
