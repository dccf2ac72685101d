"""The compiler flag policy of the host family (gcc/clang), through Runtime.compile.

The table admits exact options only; everything else is refused. Every refusal is
typed (``FlagPolicyError`` naming the flag), happens before any compiler process
starts, and leaves the cache without a leaf or a staging directory. The refusal
cases run without a sandbox (``sandbox="off"``) and, where a spelling can run a
program, carry a payload that would create a marker file: a flag that got through
would run it, and the marker would be there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import safejit
from tests.conftest import ADD_C, KERNEL_WITH_HEADER, assert_cache_sound, leaves
from tests.security._support import SECRET_TOKEN, assert_no_secret, assert_nothing_published

ADD = safejit.Source(ADD_C, "add")
#: A shell command that creates the marker file ``{M}`` (no spaces: gcc splits
#: -fcompare-debug's options at spaces; ``exec`` then runs what was wrapped).
TOUCH = 'touch${IFS}{M};exec${IFS}"$0"${IFS}"$@"'

#: Options that run a program of the tenant's, or load code into the compiler.
RUNS_PROGRAMS = {
    "compare-debug-wrapper": [f"-fcompare-debug=-wrapper /bin/sh,-c,{TOUCH}"],
    "compare-debug-plugin": ["-fcompare-debug=-fplugin={ROOT}/plugin.so"],
    "compare-debug-include-outside": ["-fcompare-debug=-include {OUT}/secret.h"],
    "compare-debug-bare": ["-fcompare-debug"],
    "compare-debug-second": ["-fcompare-debug-second"],
    "wrapper": ["-wrapper", f"/bin/sh,-c,{TOUCH}"],
    "wrapper-long": ["--wrapper", f"/bin/sh,-c,{TOUCH}"],
    "plugin": ["-fplugin={ROOT}/plugin.so"],
    "plugin-arg": ["-fplugin-arg-plugin-key=value"],
    "plugin-dir": ["-iplugindir={ROOT}"],
    "pass-plugin": ["-fpass-plugin={ROOT}/plugin.so"],
    "program-prefix-joined": ["-B{ROOT}/evil/"],
    "program-prefix-separate": ["-B", "{ROOT}/evil/"],
    "program-prefix-long": ["--prefix={ROOT}/evil/"],
    "program-prefix-abbreviated": ["--pref={ROOT}/evil/"],
    "specs": ["-specs={ROOT}/evil.specs"],
    "specs-long": ["--specs={ROOT}/evil.specs"],
    "specs-separate": ["-specs", "{ROOT}/evil.specs"],
    "response-file": ["@{ROOT}/evil.rsp"],
    "response-file-outside": ["@{OUT}/secret"],
    "driver-config": ["--config={ROOT}/evil.cfg"],
    "driver-config-separate": ["--config", "{ROOT}/evil.cfg"],
    "ccc-install-dir": ["-ccc-install-dir", "{ROOT}/evil"],
    "ccc-gcc-name": ["-ccc-gcc-name", "{ROOT}/evil/as"],
    "xclang-load": ["-Xclang", "-load", "-Xclang", "{ROOT}/plugin.so"],
    "module-mapper": ["-fmodule-mapper=|/usr/bin/touch {M}"],
    "linker-swap": ["-fuse-ld=gold"],
    "linker-path": ["--ld-path={ROOT}/evil/ld"],
    "linker-plugin": ["-fuse-linker-plugin"],
    "xlinker-plugin": ["-Xlinker", "-plugin", "-Xlinker", "{ROOT}/plugin.so"],
    "wl-plugin": ["-Wl,-plugin,{ROOT}/plugin.so"],
    "xassembler": ["-Xassembler", "--MD"],
    "xpreprocessor": ["-Xpreprocessor", "-M"],
    "raw-assembler": ["-Wa,-a={M}"],
    "raw-preprocessor": ["-Wp,-MD,{M}"],
    "mllvm": ["-mllvm", "-info-output-file={M}"],
}
#: Options that write files (outputs, dumps, profiles) or change what the key must hold.
WRITES_FILES = {
    "output": ["-o", "{M}"],
    "output-joined": ["-o{M}"],
    "output-long": ["--output={M}"],
    "depfile": ["-MF", "{M}"],
    "make-deps": ["-MD"],
    "make-user-deps": ["-MMD"],
    "deps-target": ["-MT", "x"],
    "save-temps": ["-save-temps"],
    "save-temps-obj": ["-save-temps=obj"],
    "save-temps-long": ["--save-temps"],
    "dumpdir": ["-dumpdir", "{M}/"],
    "dumpbase": ["-dumpbase", "{M}"],
    "dump-tree": ["-fdump-tree-all"],
    "dump-rtl-to-file": ["-fdump-rtl-all={M}"],
    "dump-ipa": ["-fdump-ipa-all"],
    "opt-info": ["-fopt-info-all={M}"],
    "stack-usage": ["-fstack-usage"],
    "callgraph-info": ["-fcallgraph-info"],
    "time-trace": ["-ftime-trace"],
    "time-file": ["-time={M}"],
    "optimization-record": ["-fsave-optimization-record"],
    "profile-generate": ["-fprofile-generate"],
    "profile-arcs": ["-fprofile-arcs"],
    "profile-dir": ["-fprofile-dir={M}"],
    "profile-update": ["-fprofile-update=atomic"],
    "coverage": ["--coverage"],
    "test-coverage": ["-ftest-coverage"],
    "profile-use": ["-fprofile-use={OUT}/secret"],
    "auto-profile": ["-fauto-profile={OUT}/secret"],
    "deps-file": ["-fdeps-file={M}"],
    "sarif-file": ["-fdiagnostics-format=sarif-file"],
    "split-dwarf": ["-gsplit-dwarf"],
    "record-switches": ["-frecord-gcc-switches"],
    "debug-prefix-map": ["-fdebug-prefix-map=/=/x"],
    "file-prefix-map": ["-ffile-prefix-map=/=/x"],
    "crash-diagnostics-dir": ["-fcrash-diagnostics-dir={M}"],
    "modules-cache-path": ["-fmodules-cache-path={M}"],
    "linker-output": ["-Wl,-o,{M}"],
    "linker-map": ["-Wl,-Map={M}"],
    "linker-depfile": ["-Wl,--dependency-file={M}"],
}
#: Options that read files nothing confines or records, or swap where things are found.
READS_FILES = {
    "sysroot": ["--sysroot=/"],
    "isysroot": ["-isysroot", "/"],
    "iprefix": ["-iprefix", "/"],
    "iwithprefix": ["-iwithprefix", "x"],
    "library-dir": ["-L/tmp"],
    "library-dir-separate": ["-L", "/tmp"],
    "library-dir-long": ["--library-directory=/tmp"],
    "library-by-path": ["-l/abs/lib"],
    "library-by-file-name": ["-l:libm.so.6"],
    "library-separate": ["-l", "m"],
    "include-pch": ["-include-pch", "{OUT}/secret"],
    "linker-script": ["-T", "{OUT}/secret"],
    "linker-script-wl": ["-Wl,-T,{OUT}/secret"],
    "version-script": ["-Wl,--version-script={OUT}/secret"],
    "input-file": ["{OUT}/secret"],
    "input-stdin": ["-"],
    "linker-response-file": ["-Wl,@asm.d"],
    "linker-response-file-as-value": ["-Wl,-z,@asm.d"],
    "nostdinc": ["-nostdinc"],
    "include-dir-option": ["-I", "-fplugin=x"],
    "include-dir-dash": ["-I-"],
}
#: Options whose effect lands in the host process when the artifact is loaded.
LOAD_TIME = {
    "fast-math": ["-ffast-math"],
    "fast-math-by-level": ["-Ofast"],
    "unsafe-math": ["-funsafe-math-optimizations"],
    "fast-math-model": ["-ffp-model=fast"],
    "x87-precision": ["-mpc32"],
    "sanitize-address": ["-fsanitize=address"],
    "sanitize-undefined": ["-fsanitize=undefined"],
    "sanitize-recover": ["-fsanitize-recover=all"],
    "sanitize-trap": ["-fsanitize-trap=all"],
    "sanitize-ignorelist": ["-fsanitize-ignorelist={OUT}/secret"],
    "execstack": ["-Wl,-z,execstack"],
    "execstack-among-others": ["-Wl,-z,now,-z,execstack"],
    "execstack-driver": ["-z", "execstack"],
    "execstack-driver-joined": ["-zexecstack"],
    "no-as-needed": ["-Wl,--no-as-needed", "-lm"],
    "rpath": ["-Wl,-rpath,{ROOT}"],
    "rpath-equals": ["-Wl,-rpath={ROOT}"],
    "rpath-long": ["-Wl,--rpath={ROOT}"],
    "rpath-R": ["-Wl,-R,{ROOT}"],
    "rpath-R-joined": ["-Wl,-R{ROOT}"],
    "rpath-origin": ["-Wl,-rpath,$ORIGIN"],
    "rpath-xlinker": ["-Xlinker", "-rpath", "-Xlinker", "{ROOT}"],
    "rpath-link": ["-Wl,-rpath-link,{ROOT}"],
    "soname": ["-Wl,-soname,libcuda.so.1"],
    "soname-h": ["-Wl,-h,libcuda.so.1"],
    "init": ["-Wl,-init,add"],
    "fini": ["-Wl,-fini,add"],
    "interpose": ["-Wl,-z,interpose"],
    "initfirst": ["-Wl,-z,initfirst"],
    "global": ["-Wl,-z,global"],
    "whole-archive": ["-Wl,--whole-archive"],
    "library-segfault": ["-lSegFault"],
    "library-memusage": ["-lmemusage"],
    "library-asan": ["-lasan"],
    "library-through-linker": ["-Wl,-lasan"],
    "static": ["-static"],
    "static-pie": ["-static-pie"],
    "static-libstdcxx": ["-static-libstdc++"],
    "nostdlib": ["-nostdlib"],
    "nostartfiles": ["-nostartfiles"],
    "nodefaultlibs": ["-nodefaultlibs"],
}
#: Options that change what is built or print instead of building.
OUTPUT_KIND = {
    "language": ["-x", "c"],
    "language-joined": ["-xc"],
    "preprocess-only": ["-E"],
    "assembly-only": ["-S"],
    "object-only": ["-c"],
    "syntax-only": ["-fsyntax-only"],
    "print-commands": ["-###"],
    "verbose": ["-v"],
    "verbose-long": ["--verbose"],
    "print-search-dirs": ["-print-search-dirs"],
    "print-file-name": ["-print-file-name=libc.so"],
    "print-prog-name-long": ["--print-prog-name=cc1"],
    "dumpmachine": ["-dumpmachine"],
    "help": ["--help"],
    "version": ["--version"],
    "link-time-optimisation": ["-flto"],
    "lto-jobs": ["-flto=8"],
    "lto-partitions": ["-flto-partition=max"],
}
#: Spellings near table entries: a prefix or a family is never enough.
NOT_ON_THE_TABLE = {
    "unknown-f": ["-ffoo"],
    "unknown-m": ["-mfoo-bar"],
    "param": ["--param", "max-inline-insns-single=1000"],
    "param-other": ["--param=max-unroll-times=1"],
    "march-shell": ["-march=$(touch {M})"],
    "march-path": ["-march=/x"],
    "std-extra": ["-std=c11;x"],
    "O-level": ["-O4"],
    "warning-list": ["-Werror=a,b"],
    "visibility-value": ["-fvisibility=evil"],
    "linker-version": ["-Wl,--version"],
    "linker-option-as-value": ["-Wl,-z,--version-script=x.map"],
    "linker-odd-characters": ["-Wl,--exclude-libs,lib x.a"],
    "linker-nothing": ["-Wl,"],
    "linker-z-unknown": ["-Wl,-z,foo"],
    "linker-z-missing": ["-Wl,-z"],
    "nvcc-option": ["-Xptxas=-v"],
    "bisheng-option": ["--cce-auto-sync"],
}
CLASSES = {
    "runs-programs": RUNS_PROGRAMS,
    "writes-files": WRITES_FILES,
    "reads-files": READS_FILES,
    "load-time": LOAD_TIME,
    "output-kind": OUTPUT_KIND,
    "not-on-the-table": NOT_ON_THE_TABLE,
}
REFUSED = [pytest.param(flags, id=f"{cls}:{name}") for cls, table in CLASSES.items() for name, flags in table.items()]


def _rt(make_runtime, project: Path, **config) -> safejit.Runtime:
    return make_runtime(source_roots=(str(project),), **config)


class Shared:
    """One runtime, without a sandbox, for the many refusal cases: it never compiles,
    so its cache stays empty and the marker is never made however many it has seen.
    The project holds what the attacks would use: a dir of programs that make the
    marker (for -B), a response file and a spec file."""

    def __init__(self, root: Path) -> None:
        self.project = root / "project"
        (self.project / "include").mkdir(parents=True)
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "secret").write_text(f"{SECRET_TOKEN}\n")
        (self.outside / "secret.h").write_text(f"/* {SECRET_TOKEN} */\n")
        self.marker = root / "marker"
        evil = self.project / "evil"
        evil.mkdir()
        for tool in ("as", "ld", "cc1", "collect2"):
            (evil / tool).write_text(f'#!/bin/sh\ntouch {self.marker}\nexec /usr/bin/{tool} "$@"\n')
            (evil / tool).chmod(0o755)
        (self.project / "evil.rsp").write_text(self.fill([f"-wrapper /bin/sh,-c,{TOUCH}"])[0] + "\n")
        (self.project / "evil.specs").write_text(f"*cc1:\n+ -wrapper /bin/sh,-c,touch${{IFS}}{self.marker}\n")
        (self.project / "evil.cfg").write_text(f"-B{evil}/\n")
        self.cache_dir = root / "cache"
        self.rt = safejit.Runtime(
            config=safejit.Config(cache_dirs=(str(self.cache_dir),), source_roots=(str(self.project),), sandbox="off")
        )

    def fill(self, flags: list[str]) -> list[str]:
        return [
            f.replace("{M}", str(self.marker)).replace("{ROOT}", str(self.project)).replace("{OUT}", str(self.outside))
            for f in flags
        ]

    def assert_refused_cleanly(self, exc: pytest.ExceptionInfo) -> None:
        assert self.rt.stats()["compiles"] == 0
        assert not self.marker.exists()
        assert_no_secret(exc.value)
        assert_nothing_published(self.cache_dir)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[Shared]:
    made = Shared(tmp_path_factory.mktemp("flag-policy"))
    yield made
    made.rt.close()


@pytest.mark.parametrize("flags", REFUSED)
def test_refused_flag_is_refused(shared, flags):
    flags = shared.fill(flags)
    with pytest.raises(safejit.FlagPolicyError) as exc:
        shared.rt.compile(ADD, flags=flags)
    assert exc.value.flag == flags[0]
    shared.assert_refused_cleanly(exc)


PAYLOADS = {
    "compare-debug": RUNS_PROGRAMS["compare-debug-wrapper"],
    "wrapper": RUNS_PROGRAMS["wrapper"],
    "program-prefix": RUNS_PROGRAMS["program-prefix-joined"],
    "response-file": RUNS_PROGRAMS["response-file"],
    "driver-config": RUNS_PROGRAMS["driver-config"],
}


@pytest.mark.skipif(not Path("/usr/bin/gcc").exists(), reason="needs gcc")
@pytest.mark.parametrize("name", ["compare-debug", "wrapper", "program-prefix", "response-file"])
def test_the_payloads_are_live_with_gcc_itself(tmp_path, name):
    """The attacks below are real: handed to gcc directly, each runs the marker's program."""
    shared = Shared(tmp_path)
    shared.rt.close()
    src = tmp_path / "add.c"
    src.write_text(ADD_C)
    argv = ["/usr/bin/gcc", "-shared", "-fPIC", *shared.fill(PAYLOADS[name]), "-o", str(tmp_path / "add.so"), str(src)]
    subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert shared.marker.exists()


@pytest.mark.skipif(not Path("/usr/bin/gcc").exists(), reason="needs gcc")
@pytest.mark.parametrize("flag", ["-ffast-math", "-Ofast", "-funsafe-math-optimizations"])
def test_fast_math_would_set_the_host_process_floating_point_mode(tmp_path, flag):
    """Why the fast-math spellings are refused for the host: gcc links crtfastmath.o into
    a shared object too, and its initialiser (set_fast_math) sets flush-to-zero and
    denormals-are-zero for the process that loads it. (Its parts, -fno-math-errno,
    -ffinite-math-only..., link nothing.)"""
    src = tmp_path / "add.c"
    src.write_text(ADD_C)
    out = tmp_path / "add.so"
    subprocess.run(["/usr/bin/gcc", "-shared", "-fPIC", flag, "-o", str(out), str(src)], check=True, timeout=60)
    assert b"set_fast_math" in out.read_bytes()


@pytest.mark.parametrize("sandbox", ["off", "auto"])
@pytest.mark.parametrize("flags", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_a_flag_that_would_run_a_program_runs_nothing(tmp_path, cache_dir, sandbox, flags):
    """Each of these runs the marker's program when handed to the compiler (gcc: the first
    four, see above; --config: clang); through safejit, with or without the sandbox, it
    never reaches the compiler."""
    shared = Shared(tmp_path)
    rt = safejit.Runtime(
        config=safejit.Config(cache_dirs=(str(cache_dir),), source_roots=(str(shared.project),), sandbox=sandbox)
    )
    try:
        with pytest.raises(safejit.FlagPolicyError):
            rt.compile(ADD, flags=shared.fill(flags))
        assert rt.stats()["compiles"] == 0
    finally:
        rt.close()
        shared.rt.close()
    assert not shared.marker.exists()
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("form", ["joined", "separate", "isystem", "include-file", "idirafter"])
def test_include_flag_outside_roots_is_refused(shared, form):
    outside = shared.outside
    flags = {
        "joined": [f"-I{outside}"],
        "separate": ["-I", str(outside)],
        "isystem": ["-isystem", str(outside)],
        "include-file": ["-include", str(outside / "secret.h")],
        "idirafter": ["-idirafter", str(outside)],
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


@pytest.mark.parametrize("name", ["1X", "X-Y", "X Y", "X=1", "", "X\n", "é", "X\ud800"])
def test_define_with_non_identifier_name_is_refused(shared, name):
    with pytest.raises(safejit.ConfigError) as exc:
        shared.rt.compile(ADD, defines={name: "1"})
    shared.assert_refused_cleanly(exc)


@pytest.mark.parametrize(
    "value",
    ['1\n#include "/etc/passwd"', "1\r\n#define Y 2", "1\0", "\n", "1\ud800"],
    ids=["newline-include", "crlf", "nul", "bare-newline", "lone-surrogate"],
)
def test_define_value_with_newline_nul_or_no_utf8_is_refused(shared, value):
    with pytest.raises(safejit.ConfigError) as exc:
        shared.rt.compile(ADD, defines={"X": value})
    assert "root:" not in str(exc.value)
    shared.assert_refused_cleanly(exc)


@pytest.mark.parametrize(
    "flags",
    [["-D", 'X=1\n#include "/etc/passwd"'], ["-U", "X\n"], ["-D", "X=\0"], ["-D", 5], ["-D"]],
    ids=["D-newline", "U-newline", "D-nul", "D-not-str", "D-missing"],
)
def test_separate_define_flag_value_with_newline_or_nul_is_refused(make_runtime, project, cache_dir, flags):
    rt = _rt(make_runtime, project)  # its own runtime: with the bug, the newline cases compile
    with pytest.raises(safejit.FlagPolicyError):
        rt.compile(ADD, flags=flags)
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize("flags", [["-DX=\ud800"], ["-D", "X=\ud800"], ["-O2\ud800"], ["-I", "/x\ud800"]])
def test_a_flag_holding_a_lone_surrogate_is_refused_typed(shared, flags):
    with pytest.raises(safejit.ConfigError) as exc:  # (any text is checked before the policy)
        shared.rt.compile(ADD, flags=flags)
    shared.assert_refused_cleanly(exc)


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


def test_refusal_names_the_flag_and_why(shared):
    with pytest.raises(safejit.FlagPolicyError) as exc:
        shared.rt.compile(ADD, flags=["-O2", "-fcompare-debug=-gtoggle"])
    assert exc.value.flag == "-fcompare-debug=-gtoggle"
    assert "second compile" in str(exc.value)
    with pytest.raises(safejit.FlagPolicyError) as exc:
        shared.rt.compile(ADD, flags=["-fno-such-thing"])
    assert "'-fno-such-thing'" in str(exc.value) and "not on the gcc allow-list" in str(exc.value)
    shared.assert_refused_cleanly(exc)


C_FLAGS = [
    *("-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror=return-type", "-Wformat=2", "-std=c11", "-DX=1"),
    *("-march=x86-64-v2", "-mtune=generic", "-mavx2", "-mfma", "-mno-avx512f", "-fno-strict-aliasing"),
    *("-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros", "-fno-trapping-math", "-fassociative-math"),
    *("-funroll-loops", "-fno-omit-frame-pointer", "-g", "-fstack-protector-strong", "-fvisibility=default"),
    *("-ffp-contract=fast", "-fopenmp", "-pthread", "-fno-plt", "-ffunction-sections", "-pedantic", "-lm"),
    *("-Wl,--as-needed", "-Wl,-z,relro,-z,now", "-Wl,--hash-style=gnu", "-Wl,--build-id=sha1", "-Wl,-O1"),
    *("-Wl,--exclude-libs,ALL", "-Wl,--gc-sections", "-latomic", "-fdiagnostics-color=never"),
]


def test_allowed_flags_compile(make_runtime, project, cache_dir):
    rt = _rt(make_runtime, project)
    src = safejit.Source("int add(int a, int b) { return a + b + X; }\n", "add")
    mod = rt.compile(src, flags=C_FLAGS)
    assert mod.kernel("add")(2, 3) == 6
    cxx = safejit.Source('extern "C" int twice(int a) { return 2 * a; }\n', "twice", filename="twice.cpp")
    cxx_flags = ["-std=c++17", "-fno-exceptions", "-fno-rtti", "-fvisibility-inlines-hidden", "-lstdc++"]
    assert rt.compile(cxx, flags=cxx_flags).kernel("twice")(21) == 42
    # Loading them changed nothing in this process: subnormals are not flushed to zero.
    assert sys.float_info.min / 2 > 0
    assert len(leaves(cache_dir)) == 2
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize("flags", [["-imacros", "{ROOT}/include/x.h"], ["-imacros{ROOT}/include/x.h"]])
def test_imacros_is_refused_even_inside_the_roots(shared, flags):
    """gcc reads -imacros files before every -include (safejit's guard among them), so a
    ``value.h.gch`` beside the header was loaded — compiler state no depfile names: a
    disk hit stayed 42 after the .gch changed."""
    with pytest.raises(safejit.FlagPolicyError, match="precompiled"):
        shared.rt.compile(ADD, flags=shared.fill(flags))
    assert shared.rt.stats()["compiles"] == 0


@pytest.mark.parametrize(
    ("family", "flag", "says"),
    [
        ("gcc", "-ffast-math", "its parts are admitted: -fno-math-errno"),
        ("gcc", "-Ofast", "its parts are admitted: -fno-math-errno"),
        ("nvrtc", "-I/usr/include", "pass search dirs as include_dirs="),
        ("gcc", "-fno-such-thing", "docs/security.md"),
    ],
)
def test_a_refusal_says_what_to_do_instead(family, flag, says):
    """Refusals said why, not what to do: -ffast-math without its admitted parts, an
    NVRTC -I without include_dirs=, an unknown flag without where the list is."""
    from safejit.policy.flags import check_flags

    with pytest.raises(safejit.FlagPolicyError) as exc:
        check_flags([flag], lambda path, what: path, family=family)
    assert exc.value.flag == flag and says in str(exc.value)
