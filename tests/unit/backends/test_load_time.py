"""The load-time analysis (``backends/_load_time.py``) and its baseline: kernels that
run nothing at load pass — C, C++ with templates, containers and exceptions,
OpenMP, libm, thread-locals — and compile, load and run through the host backend;
each mechanism the flag policy keeps out of reach is named all the same; the probe
reads the baseline from the toolchain's empty link and remembers it."""

from __future__ import annotations

import ctypes
import inspect
import json
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import safejit
from safejit.backends._elf import PT_DYNAMIC, PT_GNU_STACK, Elf
from safejit.backends._load_time import baseline_of, load_time_code
from safejit.backends.host import refuse_load_time_code
from tests.conftest import leaves

SHARED = ("-shared", "-fPIC", "-O2", "-fno-lto")


def _link(work: Path, code: str, *flags: str, cxx: bool = False, name: str = "k") -> bytes:
    src = work / f"{name}.{'cpp' if cxx else 'c'}"
    src.write_text(code)
    out = work / f"{name}.so"
    argv = ["c++" if cxx else "cc", *SHARED, "-o", str(out), str(src), *flags]  # (libraries after the source)
    subprocess.run(argv, check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    work = tmp_path_factory.mktemp("baseline")
    return {"c": baseline_of(_link(work, "", name="c")), "c++": baseline_of(_link(work, "", cxx=True, name="cxx"))}


def test_the_baseline_is_the_crt_files_share(baselines):
    c = baselines["c"]
    assert (c.elf_class, c.byte_order) == (2, 1)
    assert (c.init_array, c.fini_array) == (1, 1)  # frame_dummy, __do_global_dtors_aux
    assert c.init > 0 and c.fini > 0  # crti + crtn
    assert {"__gmon_start__", "__cxa_finalize"} <= set(c.startup_refs)
    assert baselines["c++"] == c


BENIGN = {
    "plain_c": (
        "int add(int a, int b) { return a + b; }\n",
        (),
        False,
        "add",
        (ctypes.c_int, ctypes.c_int),
        ctypes.c_int,
        (2, 3),
        5,
    ),
    "cxx_templates_vector_exceptions": (
        "#include <vector>\n#include <stdexcept>\n#include <numeric>\n"
        "template <typename T> static T twice(T x) { return x + x; }\n"
        'extern "C" long total(long n) {\n'
        '  try { if (n < 0) throw std::invalid_argument("n");\n'
        "    std::vector<long> v(n); std::iota(v.begin(), v.end(), 1);\n"
        "    return twice(std::accumulate(v.begin(), v.end(), 0L)); }\n"
        "  catch (const std::exception&) { return -1; }\n}\n",
        (),
        True,
        "total",
        (ctypes.c_long,),
        ctypes.c_long,
        (4,),
        20,
    ),
    "cxx_exception_caught": (
        '#include <stdexcept>\nextern "C" int safe_div(int a, int b) {\n'
        '  try { if (!b) throw std::runtime_error("0"); return a / b; } catch (...) { return -1; }\n}\n',
        (),
        True,
        "safe_div",
        (ctypes.c_int, ctypes.c_int),
        ctypes.c_int,
        (1, 0),
        -1,
    ),
    "openmp": (
        "double sum(long n) { double s = 0;\n#pragma omp parallel for reduction(+:s)\n"
        "  for (long i = 1; i <= n; ++i) s += i; return s; }\n",
        ("-fopenmp",),
        False,
        "sum",
        (ctypes.c_long,),
        ctypes.c_double,
        (100,),
        5050.0,
    ),
    "libm_static_inline_const_table": (
        "#include <math.h>\nstatic inline double sq(double x) { return x * x; }\n"
        "static const double table[4] = {1, 2, 3, 4};\n"
        "double norm(int n) { double s = 0; for (int i = 0; i < n; ++i) s += sq(table[i & 3]); return sqrt(s); }\n",
        ("-lm",),
        False,
        "norm",
        (ctypes.c_int,),
        ctypes.c_double,
        (4,),
        30**0.5,
    ),
    "thread_local_in_a_function": (
        "int counter(void) { static __thread int n; return ++n; }\n",
        (),
        False,
        "counter",
        (),
        ctypes.c_int,
        (),
        1,
    ),
    "cxx_thread_local_object_in_a_function": (
        '#include <string>\nextern "C" int grow(void) {\n'
        '  thread_local std::string s; s += "x"; return (int)s.size();\n}\n',
        (),
        True,
        "grow",
        (),
        ctypes.c_int,
        (),
        1,
    ),
}


_PINNED: list[ctypes.CDLL] = []


@pytest.mark.parametrize("case", BENIGN)
def test_benign_kernels_pass_and_run(case, make_runtime, baselines, tmp_path):
    code, flags, cxx, fn, argtypes, restype, args, result = BENIGN[case]
    if "-fopenmp" in flags:
        # Closing the runtime unloads the kernel; were libgomp unloaded with it, its idle
        # worker threads would crash the process. Keep it loaded for the process.
        _PINNED.append(ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL))
    assert load_time_code(_link(tmp_path, code, *flags, cxx=cxx), baselines["c++" if cxx else "c"]) == []
    module = make_runtime().compile(
        safejit.Source(code, case, filename=f"{case}.cpp" if cxx else None), flags=tuple(flags)
    )
    assert module.kernel(fn, argtypes=argtypes, restype=restype)(*args) == pytest.approx(result)


def _dynamic_offset(data: bytes) -> int:
    seg = next(s for s in Elf(data).segments() if s.type == PT_DYNAMIC)
    return seg.offset


def _patch_tag(data: bytes, old: int, new_tag: int, new_value: int | None = None) -> bytes:
    """``data`` with the dynamic entry of tag ``old`` given tag ``new_tag`` (and value)."""
    buf = bytearray(data)
    at = _dynamic_offset(data)
    while True:
        tag, value = struct.unpack_from("<qQ", buf, at)
        assert tag != 0, f"no tag {old}"
        if tag == old:
            struct.pack_into("<qQ", buf, at, new_tag, value if new_value is None else new_value)
            return bytes(buf)
        at += 16


def _patch_segment(data: bytes, p_type: int, new_type: int | None = None, flags: int | None = None) -> bytes:
    buf = bytearray(data)
    phoff, phnum = struct.unpack_from("<Q", buf, 0x20)[0], struct.unpack_from("<H", buf, 0x38)[0]
    for i in range(phnum):
        at = phoff + i * 56
        if struct.unpack_from("<I", buf, at)[0] == p_type:
            if new_type is not None:
                struct.pack_into("<I", buf, at, new_type)
            if flags is not None:
                struct.pack_into("<I", buf, at + 4, flags)
    return bytes(buf)


_DT_GNU_HASH, _DT_INIT, _DT_SYMENT = 0x6FFFFEF5, 12, 11


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> bytes:
    return _link(tmp_path_factory.mktemp("plain"), "int kernel(int x) { return x + 1; }\n")


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 32), "DT_PREINIT_ARRAY"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 0x6FFFFEFC), "DT_AUDIT"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 0x6FFFFEFB), "DT_DEPAUDIT"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 0x7FFFFFFF), "DT_FILTER"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 0x7FFFFFFD), "DT_AUXILIARY"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 22), "DT_TEXTREL"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, 30, 4), "DF_TEXTREL"),
        (lambda d: _patch_tag(d, _DT_GNU_HASH, _DT_SYMENT, 24), "twice"),
        (lambda d: _patch_tag(d, _DT_INIT, _DT_INIT, Elf(d).sections_named(".init")[".init"].addr + 4), "not the"),
        (lambda d: _patch_segment(d, PT_GNU_STACK, new_type=0), "no PT_GNU_STACK"),
        (lambda d: _patch_segment(d, PT_GNU_STACK, flags=7), "executable stack"),
        (lambda d: d[:18] + struct.pack("<H", 183) + d[20:], "another machine"),
        (lambda d: d[:16] + struct.pack("<H", 2) + d[18:], "no shared object"),
    ],
)
def test_what_no_flag_can_make_is_named_all_the_same(plain, baselines, patch, reason):
    assert load_time_code(plain, baselines["c"]) == []
    reasons = load_time_code(patch(plain), baselines["c"])
    assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (("-Wl,--audit,libaudit.so",), "DT_AUDIT"),
        (("-Wl,--depaudit,libaudit.so",), "DT_DEPAUDIT"),
        (("-Wl,-F,libfilter.so",), "DT_FILTER"),
        (("-Wl,-f,libaux.so",), "DT_AUXILIARY"),
        (("-Wl,-init,kernel",), "_init"),
        (("-Wl,-fini,kernel",), "_fini"),
        (("-Wl,-z,execstack",), "executable stack"),
        (("-Wl,-rpath,/opt/x",), "DT_RUNPATH"),
        (("-Wl,-rpath,/opt/x", "-Wl,--disable-new-dtags"), "DT_RPATH"),
        (("-Wl,-soname,libm.so.6",), "DT_SONAME"),
    ],
)
def test_linker_options_the_flag_policy_refuses_are_named(tmp_path, baselines, flags, reason):
    data = _link(tmp_path, "int kernel(int x) { return x + 1; }\n", *flags)
    assert any(reason in r for r in load_time_code(data, baselines["c"]))


def test_a_library_needed_by_path_is_named(tmp_path, baselines):
    lib = tmp_path / "libdep.so"
    lib.write_bytes(_link(tmp_path, "int dep(void) { return 1; }\n", name="dep"))
    data = _link(tmp_path, "int dep(void);\nint kernel(void) { return dep(); }\n", str(lib))
    assert load_time_code(data, baselines["c"]) == [f"it loads a library by path (DT_NEEDED '{lib}')"]


def test_a_toolchain_without_a_baseline_refuses_every_kernel(plain, baselines):
    spec = SimpleNamespace(name="k", toolchain=SimpleNamespace(load_baseline=None))
    with pytest.raises(safejit.LoadTimeCodeError, match="could not be made or read"):
        refuse_load_time_code(spec, plain)  # type: ignore[arg-type]
    spec.toolchain.load_baseline = baselines["c"]
    refuse_load_time_code(spec, plain)  # type: ignore[arg-type]
    with pytest.raises(safejit.LoadError):
        refuse_load_time_code(spec, b"\x7fELF garbage")  # type: ignore[arg-type]


def test_a_pass_is_remembered_only_for_the_same_bytes_and_baseline(plain, baselines, monkeypatch):
    from safejit.backends import host

    calls = []
    real = host.load_time_code
    monkeypatch.setattr(host, "load_time_code", lambda data, base: calls.append(1) or real(data, base))
    monkeypatch.setattr(host, "_passed", None)  # (what earlier tests left)
    spec = SimpleNamespace(name="k", toolchain=SimpleNamespace(load_baseline=baselines["c"]))
    refuse_load_time_code(spec, plain)  # type: ignore[arg-type]
    refuse_load_time_code(spec, bytes(plain))  # type: ignore[arg-type]  # (equal bytes, another object)
    assert len(calls) == 1
    spec.toolchain.load_baseline = baselines["c++"]
    refuse_load_time_code(spec, plain)  # type: ignore[arg-type]
    assert len(calls) == 2
    with pytest.raises(safejit.LoadTimeCodeError):  # (a refusal is never remembered as a pass)
        for _ in range(2):
            refuse_load_time_code(spec, _patch_segment(plain, PT_GNU_STACK, flags=7))  # type: ignore[arg-type]


def test_a_compile_checks_its_artifact_once_at_its_close(make_runtime, monkeypatch):
    from safejit.backends import host

    seen = []
    real = host.load_time_code

    def looked(data, base):
        seen.append(any(f.function == "closed_artifact" for f in inspect.stack(0)))
        return real(data, base)

    monkeypatch.setattr(host, "load_time_code", looked)
    rt = make_runtime()
    for i in range(2):
        assert rt.compile(safejit.Source(f"int k{i}(void) {{ return {i}; }}\n", f"k{i}")).kernel(f"k{i}")() == i
    assert seen == [True, True]  # (one look each, made at the close while the driver exited; none after)


def test_an_artifact_refused_at_its_close_is_refused_after_it(make_runtime, cache_dir):
    rt = make_runtime()
    code = (
        "static int x;\n__attribute__((constructor)) static void at_load(void) { x = 1; }\nint k(void) { return x; }\n"
    )
    for _ in range(2):
        with pytest.raises(safejit.LoadTimeCodeError, match=r"initialisers \(DT_INIT_ARRAY\)"):
            rt.compile(safejit.Source(code, "k"))
    assert leaves(cache_dir) == []  # nothing published


def test_the_probe_keeps_the_baseline_in_the_toolchain_and_its_cache(make_runtime, private_state, baselines):
    tools = private_state  # (the probe cache is in the private state dir, outside the cache root)
    module = make_runtime().compile(safejit.Source("int one(void) { return 1; }\n", "one"))
    assert module.kernel("one")() == 1
    (probe,) = [json.loads(p.read_text()) for p in tools.rglob("probe-*.json")]
    assert probe["load_baseline"]["init_array"] == baselines["c"].init_array
    assert tuple(probe["load_baseline"]["startup_refs"]) == baselines["c"].startup_refs
    again = make_runtime()
    assert again.compile(safejit.Source("int one(void) { return 1; }\n", "one")).artifact.build_key == (
        module.artifact.build_key
    )
    backend = again._init()[0].backend
    assert backend._probed["c"].load_baseline == baselines["c"]  # (read back from the probe cache)


@pytest.mark.parametrize(
    "planted",
    [
        {"init": "23"},
        {"startup_refs": "__gmon_start__"},
        {"startup_refs": [1]},
        {"extra": 1},
        {"init": True},
    ],
)
def test_a_probe_cache_entry_with_a_bad_baseline_is_probed_again(make_runtime, private_state, planted):
    tools = private_state
    make_runtime().compile(safejit.Source("int one(void) { return 1; }\n", "one"))
    (path,) = tools.rglob("probe-*.json")
    data = json.loads(path.read_text())
    data["load_baseline"].update(planted)
    path.write_text(json.dumps(data))
    rt = make_runtime()
    rt.compile(safejit.Source("int two(void) { return 2; }\n", "two"))
    assert isinstance(rt._init()[0].backend._probed["c"].load_baseline, safejit.spec.LoadBaseline)
    assert json.loads(path.read_text())["load_baseline"]["init"] != "23"


RELR_SOURCE = (
    "static int a, b, c;\nint* tab[] = {&a, &b, &c, &a, &b, &c, &a, &b, &c};\nint get(int i) { return *tab[i]; }\n"
)


def test_packed_relative_relocations_are_read_as_the_loader_reads_them(tmp_path, baselines):
    from safejit.backends._load_time import _relocs

    data = _link(tmp_path, RELR_SOURCE, "-Wl,-z,pack-relative-relocs")
    elf = Elf(data)
    listed = subprocess.run(["readelf", "-rW", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
    relr = listed.split(".relr.dyn")[1].split("\n\n")[0].splitlines()[2:]  # (readelf: one offset a line)
    assert {int(w, 16) for w in relr} == {w for w, t in _relocs(elf, dict(elf.dynamic() or ())) if t == -1}
    assert len(relr) >= 9
    assert load_time_code(data, baselines["c"]) == []
    ctor = "int x;\n__attribute__((constructor)) static void run(void) { x = 1; }\n" + RELR_SOURCE
    assert load_time_code(_link(tmp_path, ctor, "-Wl,-z,pack-relative-relocs"), baselines["c"])


def test_tables_too_large_for_any_kernel_are_elf_errors(tmp_path, baselines, monkeypatch):
    from safejit.backends import _elf, _load_time

    data = _link(tmp_path, RELR_SOURCE, "-Wl,-z,pack-relative-relocs")
    monkeypatch.setattr(_load_time, "_MAX_RELOCATIONS", 4)
    with pytest.raises(_elf.ElfError, match="relocations"):
        load_time_code(data, baselines["c"])
    monkeypatch.setattr(_elf, "MAX_DYNAMIC", 4)
    with pytest.raises(_elf.ElfError, match="dynamic table"):
        Elf(data).dynamic()
