"""nvcc runs its steps through a shell: no tenant text may reach it as shell text.

A define value nvcc could mangle or its shell could run (``$(…)``, backquotes, ``;``,
quotes, commas, backslashes) is passed in a generated header instead, and arrives in
the kernel as plain text; a path that holds such characters is refused; ptxas options
come from an exact table. The attacks really run when handed to nvcc itself (first
test); through safejit, with the sandbox off or on, they never do. Also here: the
options nvcc's and NVRTC's tables refuse, and some they take.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import safejit
from tests.conftest import assert_cache_sound, leaves
from tests.security._support import assert_nothing_published

pytest.importorskip("cuda.bindings.nvrtc")
NVCC = shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/bin")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc")

KERNEL = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n'
#: On the command line they are quoted by nvcc, where none of their characters acts.
PLAIN = {
    "A0": "1&&touch {M}",
    "A1": "1|touch {M}",
    "A2": "(touch {M})",
    "A3": "x<y||1>{M}",
    "A4": "a b c",
    "A5": "!x?~0:[0]",
    "A6": "{1}*p%2^3",
}
#: What nvcc's shell or nvcc itself would act on: these go into the header.
SHELL = {
    "Z0": "$(touch {M})",
    "Z1": "`touch {M}`",
    "Z2": "1;touch {M}",
    "Z3": "${HOME}x$0",
    "Z4": "a,b",
    "Z5": '"q"',
    "Z6": "'c'",
    "Z7": '"a\\\\b"',
    "Z8": "a#b$$",
}


def _stringify_all(names: list[str]) -> str:
    """A kernel that keeps ``<NAME<value>NAME>`` for each macro in the cubin."""
    lines = ["#define S_(...) #__VA_ARGS__", "#define S(...) S_(__VA_ARGS__)"]
    lines += [f'__device__ const char v_{n}[] = "<{n}<" S({n}) ">{n}>";' for n in names]
    uses = " ".join(f"o[{i}] = v_{n}[threadIdx.x];" for i, n in enumerate(names))
    lines.append(f'extern "C" __global__ void k(char* o) {{ {uses} }}')
    return "\n".join(lines) + "\n"


def _nvcc_rt(make_runtime, root: Path, **config) -> safejit.Runtime:
    return make_runtime(backend="cuda", cuda_compiler="nvcc", source_roots=(str(root),), **config)


def _manifest_argv(art: safejit.Artifact) -> list[str]:
    import json

    return json.loads((Path(art.path) / "manifest.json").read_text())["argv"]


@needs_nvcc
@pytest.mark.parametrize(
    "argv",
    [["-DX=`touch {M}`"], ["-DX=$(touch {M})"], ["--ptxas-options=-v;touch {M};"], ["-Xptxas=-v`touch {M}`"]],
    ids=["define-backquotes", "define-substitution", "ptxas-semicolon", "ptxas-backquotes"],
)
def test_the_payloads_are_live_with_nvcc_itself(tmp_path, argv):
    marker = tmp_path / "marker"
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    args = [a.replace("{M}", str(marker)) for a in argv]
    assert NVCC is not None
    subprocess.run(
        [NVCC, "--cubin", "-arch=sm_90", *args, "-o", str(tmp_path / "k.cubin"), str(src)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert marker.exists()


@needs_nvcc
@pytest.mark.parametrize("route", ["defines", "flags"])
@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_define_values_reach_the_kernel_as_text_and_run_nothing(make_runtime, tmp_path, cache_dir, sandbox, route):
    marker = tmp_path / "marker"
    values = {k: v.replace("{M}", str(marker)) for k, v in {**PLAIN, **SHELL}.items()}
    rt = _nvcc_rt(make_runtime, tmp_path, sandbox=sandbox)
    src = safejit.Source(_stringify_all(sorted(values)), "k")
    if route == "defines":
        art = rt.build(src, defines=values, arch="sm_90")
    else:
        art = rt.build(src, flags=[f"-D{k}={v}" for k, v in sorted(values.items())], arch="sm_90")
    assert not marker.exists()
    cubin = (Path(art.path) / "artifact.cubin").read_bytes()
    for name, value in values.items():
        assert f"<{name}<{value}>{name}>".encode() in cubin, name
    argv = _manifest_argv(art)
    # The plain ones on the command line, the rest in the header: no shell text in argv.
    assert [a for a in argv if a.startswith("-DA")] == [f"-D{k}={values[k]}" for k in sorted(PLAIN)]
    assert not [a for a in argv if a.startswith("-DZ")]
    assert "-include" in argv
    assert not [a for a in argv if re.search(r"[$`;\"'\\]", a)]
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


@needs_nvcc
def test_macros_keep_their_order_across_the_header(make_runtime, tmp_path):
    code = (
        "#ifdef P\n#define P_IS 1\n#else\n#define P_IS 0\n#endif\n"
        "#ifdef Q\n#define Q_IS 1\n#else\n#define Q_IS 0\n#endif\n"
        "__device__ const char v[] = {'<', P_IS + 48, Q_IS + 48, R + 48, '>', 0};\n"
        'extern "C" __global__ void k(char* o) { o[0] = v[threadIdx.x]; }\n'
    )
    rt = _nvcc_rt(make_runtime, tmp_path)
    # P is defined through the header, then undefined; Q undefined, then defined.
    flags = ["-DR=7", "-DP=a,b", "-UP", "-UQ", "-DQ=$(x)"]
    art = rt.build(safejit.Source(code, "k"), flags=flags, arch="sm_90")
    assert b"<017>" in (Path(art.path) / "artifact.cubin").read_bytes()
    assert "-DR=7" in _manifest_argv(art)


@needs_nvcc
@pytest.mark.parametrize(
    "value", ["1\\", "1??/", "/* x", "a/*b*/"], ids=["backslash", "trigraph", "comment", "comment2"]
)
def test_a_value_the_header_cannot_hold_is_refused(make_runtime, tmp_path, cache_dir, value):
    rt = _nvcc_rt(make_runtime, tmp_path, sandbox="off")
    with pytest.raises(safejit.FlagPolicyError):
        rt.build(safejit.Source(KERNEL, "k"), defines={"X": "$", "Y": value}, arch="sm_90")
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


#: Directory names that act in nvcc's shell. It runs in the work dir, which with
#: ``scratch="cache"`` is ``<cache>/v1/tmp/<id>``: ``${PWD%%v1*}`` is the cache root, so
#: a command that ran leaves ``<cache>/marker`` (a name can hold no slash).
SHELL_DIRS = {
    "backquotes": "inc`touch ${PWD%%v1*}marker`",
    "substitution": "inc$(touch ${PWD%%v1*}marker)",
    "semicolon": "inc;touch marker",
    "space": "my inc",
    "comma": "inc,x",
    "double-quote": 'inc"x',
    "single-quote": "inc'x",
    "backslash": "inc\\x",
}


@needs_nvcc
def test_the_path_payload_is_live_with_nvcc_itself(tmp_path):
    inc = tmp_path / "proj" / SHELL_DIRS["backquotes"]
    inc.mkdir(parents=True)
    work = tmp_path / "cache" / "v1" / "tmp" / "x"
    work.mkdir(parents=True)
    (work / "k.cu").write_text(KERNEL)
    assert NVCC is not None
    argv = [NVCC, "--cubin", "-arch=sm_90", f"-I{inc}", "-o", "k.cubin", "k.cu"]
    subprocess.run(argv, cwd=work, capture_output=True, timeout=120, check=False)
    assert (tmp_path / "cache" / "marker").exists()


@needs_nvcc
@pytest.mark.parametrize("sandbox", ["off", "auto"])
@pytest.mark.parametrize("form", ["include_dirs", "-I", "-isystem", "-include"])
@pytest.mark.parametrize("name", SHELL_DIRS)
def test_a_path_with_shell_characters_is_refused_for_nvcc(make_runtime, tmp_path, cache_dir, sandbox, form, name):
    root = tmp_path / "proj"
    inc = root / SHELL_DIRS[name]
    inc.mkdir(parents=True)
    (inc / "h.h").write_text("#define H 1\n")
    rt = _nvcc_rt(make_runtime, root, sandbox=sandbox, scratch="cache")
    kw: dict = {"include_dirs": (str(inc),)} if form == "include_dirs" else {}
    if form in ("-I", "-isystem"):
        kw["flags"] = [form, str(inc)]
    elif form == "-include":
        kw["flags"] = ["-include", str(inc / "h.h")]
    # (a backslash is refused for every compiler, earlier: no depfile can carry it)
    error, said = (
        (safejit.PathConfinementError, "backslash")
        if name == "backslash"
        else (safejit.FlagPolicyError, "nvcc's shell")
    )
    with pytest.raises(error) as exc:
        rt.build(safejit.Source(KERNEL, "k"), arch="sm_90", **kw)
    assert said in str(exc.value)
    assert not (cache_dir / "marker").exists()
    assert_nothing_published(cache_dir)


@needs_nvcc
@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_a_root_with_shell_characters_is_refused_for_nvcc(make_runtime, tmp_path, cache_dir, sandbox):
    root = tmp_path / SHELL_DIRS["backquotes"]
    (root / "include").mkdir(parents=True)
    rt = _nvcc_rt(make_runtime, root, sandbox=sandbox, scratch="cache")
    with pytest.raises(safejit.FlagPolicyError):
        rt.build(safejit.Source(KERNEL, "k"), include_dirs=(str(root / "include"),), arch="sm_90")
    assert not (cache_dir / "marker").exists()
    assert_nothing_published(cache_dir)


@needs_nvcc
def test_a_cache_root_with_shell_characters_is_refused_for_nvcc(make_runtime, tmp_path):
    cache = tmp_path / "cache`touch ${PWD%%v1*}marker`"
    cache.mkdir()
    rt = _nvcc_rt(make_runtime, tmp_path, cache_dirs=(str(cache),), scratch="cache", sandbox="off")
    with pytest.raises(safejit.FlagPolicyError):
        rt.build(safejit.Source(KERNEL, "k"), arch="sm_90")
    assert not (cache / "marker").exists()
    assert_nothing_published(cache)


PTXAS_ATTACKS = {
    "semicolon": ["--ptxas-options=-maxrregcount=32;touch {M}"],
    "backquotes": ["-Xptxas=-v`touch {M}`"],
    "substitution": ["-Xptxas=-maxrregcount=$(touch {M})"],
    "output-file": ["-Xptxas=--output-file={M}"],
    "output-short": ["-Xptxas=-v,-o,{M}"],
    "options-file": ["--ptxas-options=--options-file={M}"],
    "relocatable": ["-Xptxas=-c"],
    "separate-value": ["-Xptxas", "-v"],
    "bare-name": ["--ptxas-options=--allow-expensive-optimizations"],
}


@needs_nvcc
@pytest.mark.parametrize("sandbox", ["off", "auto"])
@pytest.mark.parametrize("flags", PTXAS_ATTACKS.values(), ids=PTXAS_ATTACKS.keys())
def test_ptxas_option_text_never_reaches_the_shell(make_runtime, tmp_path, cache_dir, sandbox, flags):
    marker = tmp_path / "marker"
    rt = _nvcc_rt(make_runtime, tmp_path, sandbox=sandbox)
    with pytest.raises(safejit.FlagPolicyError):
        rt.build(safejit.Source(KERNEL, "k"), flags=[f.replace("{M}", str(marker)) for f in flags], arch="sm_90")
    assert rt.stats()["compiles"] == 0
    assert not marker.exists()
    assert_nothing_published(cache_dir)


NVCC_REFUSED = {
    "host-compiler": ["-ccbin", "/usr/bin/gcc"],
    "host-compiler-long": ["--compiler-bindir=/tmp"],
    "host-options": ["-Xcompiler=-fplugin=x.so"],
    "host-options-long": ["--compiler-options=-wrapper,/bin/sh"],
    "host-options-separate": ["-Xcompiler", "-fplugin=x.so"],
    "forward-unknown": ["--forward-unknown-to-host-compiler"],
    "linker-options": ["-Xlinker=-rpath,/tmp"],
    "linker-options-long": ["--linker-options=-rpath,/tmp"],
    "nvlink-options": ["-Xnvlink=-v"],
    "nvlink-options-long": ["--nvlink-options=-v"],
    "archiver": ["--archiver-binary=/bin/sh"],
    "keep": ["--keep"],
    "keep-dir": ["--keep-dir=/tmp"],
    "output": ["-o", "/tmp/x"],
    "output-dir": ["-odir=/tmp"],
    "output-dir-long": ["--output-directory=/tmp"],
    "dependency-output": ["--dependency-output=/tmp/x"],
    "depfile": ["-MF", "/tmp/x"],
    "dryrun": ["--dryrun"],
    "run": ["--run"],
    "run-short": ["-run"],
    "run-args": ["--run-args=x"],
    "library-path": ["--library-path=/tmp"],
    "library-path-short": ["-L/tmp"],
    "library": ["-lcuda"],
    "libdevice-dir": ["--libdevice-directory=/tmp"],
    "libdevice-dir-short": ["-ldir=/tmp"],
    "options-file": ["--options-file=/tmp/x"],
    "options-file-short": ["-optf=/tmp/x"],
    "time": ["--time=/tmp/x"],
    "time-trace": ["--fdevice-time-trace=/tmp/x"],
    "verbose": ["-v"],
    "arch": ["-arch=sm_80"],
    "arch-native": ["-arch=native"],
    "arch-long": ["--gpu-architecture=sm_90"],
    "code": ["-code=sm_90"],
    "gencode": ["-gencode=arch=compute_90,code=sm_90"],
    "relocatable": ["-rdc=true"],
    "relocatable-long": ["--relocatable-device-code=true"],
    "device-c": ["-dc"],
    "whole-program": ["--extensible-whole-program"],
    "whole-program-short": ["-ewp"],
    "link-time": ["-dlto"],
    "split-compile": ["--split-compile=4"],
    "cudart": ["--cudart=shared"],
    "iquote": ["-iquote", "/tmp"],
    "include-path-long": ["--include-path=/tmp"],
    "define-long": ["--define-macro=X=1"],
    "nvrtc-only": ["-default-device"],
    "host-warning": ["-Wall"],
    "std-unknown": ["-std=c++26"],
}


@pytest.fixture(scope="module")
def nvcc_rt(tmp_path_factory) -> Iterator[tuple[safejit.Runtime, Path]]:
    root = tmp_path_factory.mktemp("nvcc-policy")
    rt = safejit.Runtime(
        config=safejit.Config(backend="cuda", cuda_compiler="nvcc", cache_dirs=(str(root / "cache"),), sandbox="off")
    )
    yield rt, root / "cache"
    rt.close()


@needs_nvcc
@pytest.mark.parametrize("flags", NVCC_REFUSED.values(), ids=NVCC_REFUSED.keys())
def test_nvcc_refuses(nvcc_rt, flags):
    rt, cache = nvcc_rt
    with pytest.raises(safejit.FlagPolicyError) as exc:
        rt.build(safejit.Source(KERNEL, "k"), flags=flags, arch="sm_90")
    assert exc.value.flag == flags[0]
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache)


NVRTC_REFUSED = {
    "arch": ["--gpu-architecture=sm_80"],
    "arch-short": ["-arch=sm_80"],
    "arch-native": ["-arch=native"],
    "arch-separate": ["--gpu-architecture", "sm_80"],
    "time": ["--time=/tmp/x"],
    "time-log": ["--time=-"],
    "time-trace": ["--fdevice-time-trace=/tmp/x"],
    "pch": ["--pch"],
    "create-pch": ["--create-pch=/tmp/x"],
    "use-pch": ["--use-pch=/tmp/x"],
    "pch-dir": ["--pch-dir=/tmp"],
    "bundled-headers": ["--use-bundled-headers=/tmp/x"],
    "include-dir": ["-I/tmp"],
    "include-path": ["--include-path=/tmp"],
    "pre-include": ["--pre-include=/tmp/x.h"],
    "pre-include-short": ["-include", "/tmp/x.h"],
    "stack-limit": ["--modify-stack-limit=true"],
    "split-compile": ["--split-compile=0"],
    "lto": ["-dlto"],
    "optix": ["--optix-ir"],
    "relocatable": ["-rdc=true"],
    "device-c": ["-dc"],
    "whole-program": ["-ewp"],
    "tile-only": ["--tile-only"],
    "syntax-only": ["--fdevice-syntax-only"],
    "ptxas-output": ["--ptxas-options=--output-file=/tmp/x"],
    "ptxas-output-short": ["-Xptxas=-o,/tmp/x"],
    "ptxas-list": ["-Xptxas=-v,-O3"],
    "define-long": ["--define-macro=X=1"],
    "host-flag": ["-O3"],
    "response-file": ["@/tmp/x"],
}


@pytest.fixture(scope="module")
def nvrtc_rt(tmp_path_factory) -> Iterator[tuple[safejit.Runtime, Path]]:
    root = tmp_path_factory.mktemp("nvrtc-policy")
    rt = safejit.Runtime(config=safejit.Config(backend="cuda", cache_dirs=(str(root / "cache"),)))
    yield rt, root / "cache"
    rt.close()


@pytest.mark.parametrize("flags", NVRTC_REFUSED.values(), ids=NVRTC_REFUSED.keys())
def test_nvrtc_refuses(nvrtc_rt, flags):
    rt, cache = nvrtc_rt
    with pytest.raises(safejit.FlagPolicyError) as exc:
        rt.build(safejit.Source(KERNEL, "k"), flags=flags, arch="sm_90")
    assert exc.value.flag == flags[0]
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache)


NVCC_FLAGS = [
    *("-lineinfo", "-use_fast_math", "-maxrregcount=32", "--ftz=true", "-prec-div=false", "--fmad=true"),
    *("-Xptxas=-v,-O3,--warn-on-spills", "--ptxas-options=-dlcm=cg", "--std=c++17", "-Wno-deprecated-gpu-targets"),
    *("--diag-suppress=177,550", "-expt-relaxed-constexpr", "--extended-lambda", "-O3", "-rdc=false"),
    *("-Werror=reorder", "--default-stream=per-thread", "-DX=1", "-res-usage", "-Ofc=0"),
]
NVRTC_FLAGS = [
    *("-lineinfo", "--use_fast_math", "--maxrregcount=32", "--ftz=true", "-prec-div=false", "--fmad=true"),
    *("-Xptxas=-O3", "--ptxas-options=--warn-on-spills", "--std=c++17", "--diag-suppress=177", "--restrict"),
    *("-default-device", "--minimal"),
    *("--device-int128", "--modify-stack-limit=false", "-DX=1", "--no-source-include", "-dopt=on"),
]


@needs_nvcc
def test_nvcc_takes_what_its_table_admits(make_runtime, tmp_path):
    art = _nvcc_rt(make_runtime, tmp_path).build(safejit.Source(KERNEL, "k"), flags=NVCC_FLAGS, arch="sm_90")
    assert art.kernels == ("k",)


def test_nvrtc_takes_what_its_table_admits(make_runtime, tmp_path):
    rt = make_runtime(backend="cuda", source_roots=(str(tmp_path),))
    assert rt.build(safejit.Source(KERNEL, "k"), flags=NVRTC_FLAGS, arch="sm_90").kernels == ("k",)


@needs_nvcc
def test_a_kernel_from_a_file_finds_its_quoted_includes_with_nvcc(make_runtime, tmp_path):
    # (nvcc has no -iquote: its host preprocessor is given the source's dir)
    (tmp_path / "kern").mkdir()
    (tmp_path / "kern" / "scale.h").write_text("#define SCALE 3.0f\n")
    path = tmp_path / "kern" / "k.cu"
    path.write_text('#include "scale.h"\nextern "C" __global__ void k(float* y) { y[0] = SCALE; }\n')
    art = _nvcc_rt(make_runtime, tmp_path).build(safejit.Source.from_file(path), arch="sm_90")
    assert art.kernels == ("k",)
    assert [a for a in _manifest_argv(art) if a.startswith("-Xcompiler=-iquote,") and a.endswith("/kern")]


@needs_nvcc
@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_a_kernel_file_in_a_dir_with_shell_characters_is_refused_for_nvcc(make_runtime, tmp_path, cache_dir, sandbox):
    kern = tmp_path / SHELL_DIRS["backquotes"]
    kern.mkdir()
    (kern / "k.cu").write_text(KERNEL)
    rt = _nvcc_rt(make_runtime, tmp_path, sandbox=sandbox, scratch="cache")
    with pytest.raises(safejit.FlagPolicyError):
        rt.build(safejit.Source.from_file(kern / "k.cu"), arch="sm_90")
    assert not (cache_dir / "marker").exists()
    assert_nothing_published(cache_dir)
