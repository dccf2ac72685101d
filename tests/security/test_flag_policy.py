"""The compiler flag policy, through Runtime.compile.

Every refusal is typed, happens before the compiler runs, and leaves the cache
without a leaf or a staging directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import safejit
from tests.conftest import ADD_C, KERNEL_WITH_HEADER, assert_cache_sound, leaves
from tests.security._support import SECRET_TOKEN, assert_no_secret, assert_nothing_published

ADD = safejit.Source(ADD_C, "add")

REFUSED = {
    "output": ["-o", "/tmp/x.so"],
    "depfile": ["-MF", "x"],
    "make-deps": ["-MD"],
    "program-prefix": ["-B/tmp"],
    "plugin": ["-fplugin=x.so"],
    "response-file": ["@resp.txt"],
    "specs": ["-specs=x"],
    "sysroot": ["--sysroot=/"],
    "raw-preprocessor": ["-Wp,-MD,/tmp/x"],
    "raw-assembler": ["-Wa,-a=x"],
    "raw-linker": ["-Xlinker", "--version"],
    "wrapper": ["-wrapper", "gdb,--args"],
    "save-temps": ["-save-temps"],
    "dump": ["-fdump-tree-all"],
    "profile": ["-fprofile-generate"],
    "linker-swap": ["-fuse-ld=gold"],
    "language": ["-x", "c"],
    "preprocess-only": ["-E"],
    "assembly-only": ["-S"],
    "object-only": ["-c"],
    "library-by-path": ["-l/abs/lib"],
    "link-time-optimisation": ["-flto"],
    "lto-partitions": ["-flto-partition=max"],
    "lto-jobs": ["-flto=8"],
    "linker-response-file": ["-Wl,@asm.d"],
    "linker-response-file-as-value": ["-Wl,-z,@asm.d"],
    "linker-option-as-value": ["-Wl,-soname,--version-script=x.map"],
    "linker-odd-characters": ["-Wl,-soname,lib x.so"],
}


def _rt(make_runtime, project: Path, **config) -> safejit.Runtime:
    return make_runtime(source_roots=(str(project),), **config)


class Shared:
    """One runtime for the many refusal cases: it never compiles, so its cache
    must stay empty however many refusals it has seen."""

    def __init__(self, root: Path) -> None:
        self.project = root / "project"
        (self.project / "include").mkdir(parents=True)
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "secret").write_text(f"{SECRET_TOKEN}\n")
        (self.outside / "secret.h").write_text(f"/* {SECRET_TOKEN} */\n")
        self.cache_dir = root / "cache"
        self.rt = safejit.Runtime(
            config=safejit.Config(cache_dirs=(str(self.cache_dir),), source_roots=(str(self.project),))
        )

    def assert_refused_cleanly(self, exc: pytest.ExceptionInfo) -> None:
        assert self.rt.stats()["compiles"] == 0
        assert_no_secret(exc.value)
        assert_nothing_published(self.cache_dir)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[Shared]:
    made = Shared(tmp_path_factory.mktemp("flag-policy"))
    yield made
    made.rt.close()


@pytest.mark.parametrize("flags", REFUSED.values(), ids=REFUSED.keys())
def test_refused_flag_is_refused(shared, flags):
    with pytest.raises(safejit.FlagPolicyError) as exc:
        shared.rt.compile(ADD, flags=flags)
    assert exc.value.flag == flags[0]
    shared.assert_refused_cleanly(exc)


def test_response_file_outside_roots_is_refused_unread(shared):
    with pytest.raises(safejit.FlagPolicyError) as exc:
        shared.rt.compile(ADD, flags=[f"@{shared.outside / 'secret'}"])
    shared.assert_refused_cleanly(exc)


@pytest.mark.parametrize("form", ["joined", "separate", "isystem", "include-file"])
def test_include_flag_outside_roots_is_refused(shared, form):
    outside = shared.outside
    flags = {
        "joined": [f"-I{outside}"],
        "separate": ["-I", str(outside)],
        "isystem": ["-isystem", str(outside)],
        "include-file": ["-include", str(outside / "secret.h")],
    }[form]
    with pytest.raises(safejit.PathConfinementError) as exc:
        shared.rt.compile(ADD, flags=flags)
    shared.assert_refused_cleanly(exc)


def test_include_flag_inside_roots_keys_location_free(make_runtime, project, tmp_path, cache_dir):
    copies = [tmp_path / "a" / "project", tmp_path / "b" / "project"]
    for copy in copies:
        shutil.copytree(project, copy)
    results = []
    for copy in copies:
        rt = _rt(make_runtime, copy)
        src = safejit.Source(KERNEL_WITH_HEADER, "value")
        kw = {"include_dirs": (copy / "include",), "flags": ["-I", str(copy / "include"), f"-I{copy}"]}
        art = rt.build(src, **kw)
        assert rt.compile(src, **kw).kernel("value")() == 42
        results.append(art)
    assert results[0].build_key == results[1].build_key
    assert results[0].deps_key == results[1].deps_key
    assert results[1].source == "disk"  # the second checkout reuses the first one's leaf
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize("name", ["1X", "X-Y", "X Y", "X=1", "", "X\n", "é"])
def test_define_with_non_identifier_name_is_refused(shared, name):
    with pytest.raises(safejit.ConfigError) as exc:
        shared.rt.compile(ADD, defines={name: "1"})
    shared.assert_refused_cleanly(exc)


@pytest.mark.parametrize(
    "value",
    ['1\n#include "/etc/passwd"', "1\r\n#define Y 2", "1\0", "\n"],
    ids=["newline-include", "crlf", "nul", "bare-newline"],
)
def test_define_value_with_newline_or_nul_is_refused(shared, value):
    with pytest.raises(safejit.ConfigError) as exc:
        shared.rt.compile(ADD, defines={"X": value})
    assert "root:" not in str(exc.value)
    shared.assert_refused_cleanly(exc)


@pytest.mark.parametrize(
    "flags",
    [["-D", 'X=1\n#include "/etc/passwd"'], ["-U", "X\n"], ["-D", "X=\0"], ["-D", 5]],
    ids=["D-newline", "U-newline", "D-nul", "D-not-str"],
)
def test_separate_define_flag_value_with_newline_or_nul_is_refused(make_runtime, project, cache_dir, flags):
    rt = _rt(make_runtime, project)  # its own runtime: with the bug, the newline cases compile
    with pytest.raises(safejit.FlagPolicyError):
        rt.compile(ADD, flags=flags)
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


def test_linker_output_redirect_is_refused(make_runtime, project, cache_dir):
    victim = project / "include" / "inner.h"
    before = victim.read_bytes()
    rt = _rt(make_runtime, project, sandbox="off")
    try:
        with pytest.raises(safejit.FlagPolicyError):
            rt.compile(ADD, flags=[f"-Wl,-o,{victim}"])
    finally:
        assert victim.read_bytes() == before
    assert_nothing_published(cache_dir)


def test_module_mapper_program_is_refused(make_runtime, project, tmp_path, cache_dir):
    ran = tmp_path / "mapper-ran"
    rt = _rt(make_runtime, project, sandbox="off")
    src = safejit.Source('extern "C" int f(void) { return 1; }\n', "f", filename="f.cpp")
    try:
        with pytest.raises(safejit.FlagPolicyError):
            rt.compile(src, flags=["-fmodules-ts", f"-fmodule-mapper=|/usr/bin/touch {ran}"])
    finally:
        assert not ran.exists()
    assert_nothing_published(cache_dir)


def test_allowed_flags_compile(make_runtime, project, cache_dir):
    rt = _rt(make_runtime, project)
    src = safejit.Source("int add(int a, int b) { return a + b + X; }\n", "add")
    mod = rt.compile(src, flags=["-O3", "-Wall", "-std=c11", "-DX=1", "-march=x86-64"])
    assert mod.kernel("add")(2, 3) == 6
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_linker_path_resolving_to_a_comma_is_refused(make_runtime, project, cache_dir):
    """gcc splits -Wl, at commas: a path that resolves (behind a symlink) to a name with
    a comma would become two linker arguments — here "@asm.d", a response file."""
    (project / "x,@asm.d").mkdir()
    (project / "lib").symlink_to(project / "x,@asm.d", target_is_directory=True)
    rt = _rt(make_runtime, project, sandbox="off")
    with pytest.raises(safejit.FlagPolicyError):
        rt.compile(ADD, flags=[f"-Wl,-rpath,{project / 'lib'}"])
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


def test_linker_path_under_a_root_with_a_comma_is_refused(make_runtime, tmp_path, cache_dir):
    """The root's own path is put in at compile time: it must not split the argument."""
    root = tmp_path / "a,@asm.d"
    (root / "lib").mkdir(parents=True)
    (tmp_path / "link").symlink_to(root, target_is_directory=True)  # (the flag itself holds no comma)
    rt = make_runtime(source_roots=(str(root),), sandbox="off")
    with pytest.raises(safejit.FlagPolicyError):
        rt.compile(ADD, flags=[f"-Wl,-rpath,{tmp_path / 'link' / 'lib'}"])
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("rpath", ["${ORIGIN}", "$ORIGIN", "ws@2/lib", "My Project/lib"])
def test_plain_linker_values_still_compile(make_runtime, tmp_path, rpath):
    root = tmp_path / "ws@2"
    (root / "lib").mkdir(parents=True)
    (root / "My Project" / "lib").mkdir(parents=True)
    value = rpath if rpath.startswith("$") else str(tmp_path / rpath if rpath.startswith("ws") else root / rpath)
    rt = make_runtime(source_roots=(str(root),))
    flags = ["-Wl,-z,now", "-Wl,--hash-style=gnu", "-Wl,-soname,libadd.so.1", f"-Wl,-rpath,{value}"]
    # The flag policy lets the values through and the linker uses them; what they make
    # (a search path and a name of the object's own) is then refused from loading.
    with pytest.raises(safejit.LoadTimeCodeError) as info:
        rt.compile(ADD, flags=flags)
    assert [r.split(" (")[0] for r in info.value.reasons] == ["it has a name", "it has a library search path"]
    assert rt.compile(ADD, flags=flags[:2]).kernel("add")(2, 3) == 5
