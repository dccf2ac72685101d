"""Host kernel calls are checked against the prototype the build recorded: each wrong
argument raises, naming the parameter, and nothing is called; right ones pass, from C
and C++; the return value is the C type's; a fresh process's disk hit checks the same
(its signatures come from the manifest)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

import safejit
from safejit import ArgumentTypeError, ArgumentValueError, _hostcall

np = pytest.importorskip("numpy")

KERNELS_C = r"""
#include <stddef.h>
#include <stdint.h>
int add(int a, int b) { return a + b; }
double sum(const double *x, size_t n) { double s = 0; for (size_t i = 0; i < n; i++) s += x[i]; return s; }
void scale(double *x, long n, double f) { for (long i = 0; i < n; i++) x[i] *= f; }
int32_t narrow(char c, int32_t v) { return c + v; }
float half(float x) { return x / 2; }
void nothing(void) {}
_Bool odd(uint64_t v) { return v & 1; }
unsigned char first(const uint8_t *bytes) { return bytes[0]; }
long count(void *any, size_t n) { return any ? (long)n : -1; }
char grade(int v) { return (char)('A' + v); }
struct pair { int64_t a; void *p; };
void poke(struct pair *s) { s->a = 1; }
void shout(char *s) { s[0] = 'X'; }
_Float16 halfway(int v) { return (_Float16)v; }
double below_double(long double x) { return (double)((x - 1.0L) * 1152921504606846976.0L); }
"""

KERNELS_CXX = r"""
#include <vector>
#include <numeric>
extern "C" double total(const double *x, int n) {
  std::vector<double> v(x, x + n); return std::accumulate(v.begin(), v.end(), 0.0); }
extern "C" void axpy(int n, float a, const float *x, float *y) { for (int i = 0; i < n; ++i) y[i] += a * x[i]; }
int mangled(int a, double b) { return a + (int)b; }
"""


@pytest.fixture(scope="module", autouse=True, params=["first calls", "generated call"])
def tier(request):
    """Every test twice: through a kernel's first (generic) calls, and through the call
    generated for it (from its first call on)."""
    saved = _hostcall.WARM_CALLS
    _hostcall.WARM_CALLS = 10**9 if request.param == "first calls" else 0
    yield request.param
    _hostcall.WARM_CALLS = saved


@pytest.fixture(scope="module")
def mod(tmp_path_factory, tier):
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path_factory.mktemp("calls")),)))
    yield rt.compile(safejit.Source(KERNELS_C, "kernels"))
    rt.close()


@pytest.fixture(scope="module")
def cxx(tmp_path_factory, tier):
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path_factory.mktemp("calls-cxx")),)))
    yield rt.compile(safejit.Source(KERNELS_CXX, "kernels", filename="kernels.cpp"))
    rt.close()


# -- the wrong-argument matrix ------------------------------------------------------------
@pytest.mark.parametrize(
    ("kernel", "args", "error", "param", "says"),
    [
        ("add", (2,), ArgumentTypeError, "'b'", "missing argument 'b'"),
        ("add", (), ArgumentTypeError, "'a'", "missing argument 'a'"),
        ("add", (1, 2, 3), ArgumentTypeError, None, "takes 2 arguments, got 3"),
        ("add", ("a", "b"), ArgumentTypeError, "'a'", "expected an int, got str"),
        ("add", (1, 2.5), ArgumentTypeError, "'b'", "expected an int, got float"),
        ("add", (1, None), ArgumentTypeError, "'b'", "expected an int, got NoneType"),
        ("add", (2**31, 1), ArgumentValueError, "'a'", "2147483648 does not fit"),
        ("narrow", (128, 0), ArgumentValueError, "'c'", "char holds -128 to 127"),
        ("narrow", (1, -(2**31) - 1), ArgumentValueError, "'v'", "int32_t holds"),
        ("odd", (-1,), ArgumentValueError, "'v'", "uint64_t holds 0 to"),
        ("half", ("1.0",), ArgumentTypeError, "'x'", "expected a real number, got str"),
        ("half", (1e39,), ArgumentValueError, "'x'", "beyond the range of float"),
        ("sum", (np.arange(4, dtype=np.float32), 4), ArgumentTypeError, "'x'", "got an array of dtype float32"),
        ("sum", (np.arange(4, dtype=np.int64), 4), ArgumentTypeError, "'x'", "got an array of dtype int64"),
        ("sum", (np.arange(8.0)[::2], 4), ArgumentValueError, "'x'", "not C-contiguous"),
        ("sum", ([1.0, 2.0], 2), ArgumentTypeError, "'x'", "got list"),
        ("sum", (12345, 2), ArgumentTypeError, "'x'", "ctypes.c_void_p(address)"),
        ("sum", ((ctypes.c_float * 2)(), 2), ArgumentTypeError, "'x'", "got ctypes c_float"),
        ("scale", (b"\0" * 8, 1, 2.0), ArgumentTypeError, "'x'", "got bytes"),
    ],
)
def test_a_wrong_argument_raises_naming_the_parameter(mod, kernel, args, error, param, says):
    with pytest.raises(error) as info:
        mod.kernel(kernel)(*args)
    assert says in str(info.value)
    assert info.value.kernel == kernel and info.value.param == param
    assert str(info.value).startswith(mod.kernel(kernel).signature)


def test_a_read_only_array_for_a_non_const_pointer_is_refused(mod):
    x = np.ones(4)
    x.setflags(write=False)
    with pytest.raises(ArgumentValueError, match="read-only, and double \\* is not const") as info:
        mod.kernel("scale")(x, 4, 2.0)
    assert info.value.param == "'x'" and (x == 1).all()
    assert mod.kernel("sum")(x, 4) == 4.0  # const double *: read-only is fine


def test_bytes_are_read_only_and_bytearrays_are_not(mod):
    assert mod.kernel("first")(b"\x07rest") == 7
    assert mod.kernel("first")(bytearray(b"\x09")) == 9
    assert mod.kernel("grade")(1) == b"B"  # a plain char returns as a character, as ctypes and cffi give it
    assert mod.kernel("count")(np.zeros(3, dtype=np.int16), 3) == 3  # void *: any dtype
    assert mod.kernel("count")(None, 3) == -1  # None is NULL


def test_an_array_of_python_objects_is_refused_for_any_pointer(mod):
    """A void * (any dtype) or a struct pointer (any dtype of its size) took an array of
    Python objects, whole or in a field: the kernel wrote over the object pointers and
    the process crashed when the array was freed."""
    objects = np.array([object(), object()], dtype=object)
    with pytest.raises(ArgumentTypeError, match="Python objects"):
        mod.kernel("count")(objects, 2)
    record = np.zeros(1, dtype=[("a", "O"), ("p", "<u8")])
    with pytest.raises(ArgumentTypeError, match="Python objects"):
        mod.kernel("poke")(record)
    assert mod.kernel("poke")(np.zeros(1, dtype=[("a", "<i8"), ("p", "<u8")])) is None
    view = (ctypes.c_char * 16).from_buffer(objects)  # (a ctypes view of them: refused too, cast or not)
    for passed in (view, ctypes.cast(view, ctypes.c_char_p), ctypes.cast(view, ctypes.POINTER(ctypes.c_int64))):
        with pytest.raises(ArgumentTypeError, match="Python objects"):
            mod.kernel("count")(passed, 2)
    # (a field named with an O holds no object: taken, on the first calls and the generated one)
    named = np.zeros(1, dtype=[("a", [("Offset", "<i8")]), ("p", "<u8")])
    assert mod.kernel("poke")(named) is None and mod.kernel("count")(named, 1) == 1
    assert mod.kernel("count")((ctypes.c_char * 16).from_buffer(named), 1) == 1  # (its view too)


def test_a_c_char_p_is_read_only_for_a_non_const_char_pointer(mod):
    """bytes were refused for a char *, a c_char_p of the same bytes taken: the kernel
    wrote into an immutable bytes object (a constant of the caller's code)."""
    data = b"secret"
    with pytest.raises(ArgumentValueError, match="read-only"):
        mod.kernel("shout")(ctypes.c_char_p(data))
    assert data == b"secret"
    writable = ctypes.create_string_buffer(b"hello")  # (a c_char_p over writable memory: taken)
    mod.kernel("shout")(ctypes.cast(writable, ctypes.c_char_p))
    assert writable.value == b"Xello"
    other = b"secret-two"  # (a cast of bytes, or their bare address: nothing says they are writable)
    for passed in (ctypes.cast(other, ctypes.c_char_p), ctypes.c_char_p(ctypes.cast(other, ctypes.c_void_p).value)):
        with pytest.raises(ArgumentValueError, match="read-only"):
            mod.kernel("shout")(passed)
    assert other == b"secret-two"


def test_a_long_double_keeps_its_bits(mod):
    """A long double parameter got a double's 53 bits of NumPy's longdouble or a
    c_longdouble (converted through Python's float)."""
    if np.dtype(np.longdouble).itemsize != ctypes.sizeof(ctypes.c_longdouble) or np.finfo(np.longdouble).nmant < 60:
        pytest.skip("long double is no wider than double here")
    x = np.longdouble(1) + np.longdouble(2) ** -60
    assert mod.kernel("below_double")(x) == 1.0
    assert mod.kernel("below_double")(ctypes.c_longdouble.from_buffer_copy(x.tobytes())) == 1.0
    assert mod.kernel("below_double")(1.5) == 0.5 * 2.0**60


def test_a_complex_number_is_no_real_number(mod):
    """NumPy's complex scalars have __float__ (their real part, with a warning only)."""
    with pytest.raises(ArgumentTypeError, match="expected a real number"):
        mod.kernel("half")(np.complex128(1 + 2j))


def test_a_float16_by_value_cannot_be_checked(mod):
    """_Float16 by value was taken for a pointer: any address passed, the result read as one."""
    with pytest.raises(ArgumentTypeError, match="cannot be checked"):
        mod.kernel("halfway")(3)


def test_a_keyword_argument_is_a_type_error_naming_the_kernel(mod):
    """No kernel takes keywords: the error named this module's helper
    (``_first_calls.<locals>.call()``), or the generated ``call()``."""
    k = mod.kernel("add")
    for _ in range(2):  # (in the second tier, the generated call from the first call on)
        with pytest.raises(TypeError, match=r"^add\(\) got an unexpected keyword argument 'b'"):
            k(1, b=2)
        assert k(1, 2) == 3


def test_nothing_is_called_when_an_argument_is_wrong(mod):
    x = np.ones(4)
    with pytest.raises(ArgumentTypeError):
        mod.kernel("scale")(x, 4, "2")
    with pytest.raises(ArgumentValueError):
        mod.kernel("scale")(x, 2**63, 2.0)
    assert (x == 1).all()


def test_a_kernel_generates_its_call_after_its_first_calls(mod, monkeypatch):
    monkeypatch.setattr(_hostcall, "WARM_CALLS", 3)
    k = mod.kernel("add", restype=ctypes.c_int)  # (a declaration: a new kernel, not the cached one)
    first = type(k).__call__
    assert [k(i, 1) for i in range(3)] == [1, 2, 3] and type(k).__call__ is first
    assert k(3, 1) == 4 and type(k).__call__ is not first
    assert type(k).__call__.__code__.co_filename == "<string>"  # generated
    with pytest.raises(ArgumentValueError, match="2147483648 does not fit") as info:
        k(2**31, 1)
    assert info.value.param == "'a'" and k(2, 3) == 5


# -- right arguments -------------------------------------------------------------------------
def test_right_arguments_pass_and_the_return_type_is_the_builds(mod):
    assert mod.kernel("add")(2, 3) == 5 and mod.kernel("add")(True, np.int64(4)) == 5
    assert mod.kernel("add")(ctypes.c_int(2), 3) == 5
    assert mod.kernel("sum")(np.arange(10.0), 10) == 45.0
    assert isinstance(mod.kernel("half")(3), float) and mod.kernel("half")(3) == 1.5
    assert mod.kernel("nothing")() is None
    assert mod.kernel("odd")(3) is True and mod.kernel("odd")(np.uint64(2**64 - 2)) is False
    assert mod.kernel("narrow")(b"a", 1) == 98 and mod.kernel("narrow")(-128, 0) == -128
    x = np.arange(4.0)
    mod.kernel("scale")(x, 4, 2)
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert mod.kernel("sum")((ctypes.c_double * 3)(1, 2, 3), 3) == 6.0
    assert mod.kernel("sum")(ctypes.byref(ctypes.c_double(7)), 1) == 7.0
    assert mod.kernel("sum")(np.zeros(0), 0) == 0.0 and mod.kernel("sum")(None, 0) == 0.0
    assert mod.kernel("sum")(np.ones((2, 3)), 6) == 6.0  # C-contiguous, any shape


def test_signatures_read_as_c(mod, cxx):
    assert mod.kernel("add").signature == "int add(int a, int b)"
    assert mod.kernel("sum").signature == "double sum(const double *x, size_t n)"
    assert mod.kernel("nothing").signature == "void nothing(void)"
    assert cxx.kernel("axpy").signature == "void axpy(int n, float a, const float *x, float *y)"
    assert cxx.kernel("_Z7mangledid").signature == "int _Z7mangledid(int a, double b)"


def test_cxx_kernels_are_checked_too(cxx):
    x, y = np.ones(3, dtype=np.float32), np.zeros(3, dtype=np.float32)
    cxx.kernel("axpy")(3, 2.0, x, y)
    assert y.tolist() == [2.0, 2.0, 2.0]
    assert cxx.kernel("total")(np.arange(4.0), 4) == 6.0
    assert cxx.kernel("_Z7mangledid")(1, 2.5) == 3
    with pytest.raises(ArgumentTypeError, match="argument 'y' \\(float \\*\\)"):
        cxx.kernel("axpy")(3, 2.0, x, np.zeros(3))


# -- declarations ----------------------------------------------------------------------------
def test_argtypes_that_agree_with_the_build_are_taken(mod):
    k = mod.kernel("sum", argtypes=(ctypes.c_void_p, ctypes.c_size_t), restype=ctypes.c_double)
    assert k(np.arange(3.0), 3) == 3.0
    with pytest.raises(ArgumentTypeError, match="got an array of dtype float32"):
        k(np.arange(3, dtype=np.float32), 3)  # still checked against the build


def test_argtypes_or_restype_that_disagree_are_refused(mod):
    with pytest.raises(ArgumentTypeError, match=r"argtypes\[1\] is c_float, but 'b' is int"):
        mod.kernel("add", argtypes=(ctypes.c_int, ctypes.c_float))
    with pytest.raises(ArgumentTypeError, match="argtypes names 1 parameters, the build 2"):
        mod.kernel("add", argtypes=(ctypes.c_int,))
    with pytest.raises(ArgumentTypeError, match="restype is c_int, but the kernel returns double"):
        mod.kernel("sum", restype=ctypes.c_int)


def test_a_struct_by_value_or_varargs_is_refused_unless_declared(make_runtime):
    code = (
        "struct pair { int a; int b; };\n"
        "int both(struct pair p) { return p.a + p.b; }\n"
        "int first(int n, ...) { return n; }\n"
    )
    mod = make_runtime().compile(safejit.Source(code, "decl"))
    with pytest.raises(ArgumentTypeError, match="'p' is struct pair \\(a struct, union or class passed by value\\)"):
        mod.kernel("both")(1)

    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_int), ("b", ctypes.c_int))

    assert mod.kernel("both", argtypes=(Pair,))(Pair(2, 3)) == 5
    with pytest.raises(ArgumentTypeError, match="a variable number of arguments"):
        mod.kernel("first")(1)
    assert mod.kernel("first", argtypes=(ctypes.c_int, ctypes.c_int))(4, 5) == 4
    with pytest.raises(ArgumentTypeError, match=r"argtypes\[1\] is c_float, which ... passes as c_double"):
        mod.kernel("first", argtypes=(ctypes.c_int, ctypes.c_float))


def test_a_kernel_without_debug_info_needs_a_declaration(make_runtime):
    # (-g0 after safejit's own -g cannot be given; an asm-defined function has no DWARF)
    code = '__asm__(".globl seven\\n.type seven,@function\\nseven:\\n movl $7, %eax\\n ret\\n");\n'
    mod = make_runtime().compile(safejit.Source(code, "asm"))
    k = mod.kernel("seven")
    assert k.signature is None
    with pytest.raises(ArgumentTypeError, match=r"recorded no prototype for 'seven'.*argtypes= and restype="):
        k()
    declared = mod.kernel("seven", argtypes=(), restype=ctypes.c_int)
    assert declared() == 7
    with pytest.raises(ArgumentTypeError, match="takes 0 arguments, got 1"):
        declared(1)


# -- a fresh process -----------------------------------------------------------------------
CHILD = r"""
import json, sys
import numpy as np
import safejit
from safejit.backends import _signatures

def no_dwarf(*args, **kwargs):
    raise AssertionError("a disk hit read the artifact's DWARF")

_signatures.prototypes = no_dwarf
rt = safejit.Runtime(config=safejit.Config(cache_dirs=(sys.argv[1],)))
mod = rt.compile(safejit.Source(sys.argv[2], "kernels"))
out = {"tier": mod.artifact.tier, "compiles": rt.stats()["compiles"], "sum": mod.kernel("sum")(np.arange(4.0), 4)}
try:
    mod.kernel("sum")(np.arange(4, dtype=np.float32), 4)
except safejit.ArgumentTypeError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_a_fresh_process_disk_hit_checks_from_the_manifest(tmp_path):
    """Its signatures are the manifest's: the child never reads the artifact's DWARF."""
    cache = tmp_path / "cache"
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache),)))
    art = rt.build(safejit.Source(KERNELS_C, "kernels"))
    rt.close()
    manifest = json.loads((Path(art.path) / "manifest.json").read_text())
    assert manifest["meta"]["signatures"]["add"] == [["i4", "int"], [["a", "i4", "int"], ["b", "i4", "int"]], False]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), KERNELS_C], capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout)
    assert report["tier"] == "disk" and report["compiles"] == 0 and report["sum"] == 6.0
    assert "got an array of dtype float32" in report["error"]


def test_the_published_bytes_give_the_manifests_signatures(make_runtime):
    """``products(artifact)`` (what the early-staging path reads) agrees with the manifest."""
    from safejit._pipeline.records import backend_meta
    from safejit.backends import _signatures
    from safejit.cache.leaf import decode_manifest

    art = make_runtime().build(safejit.Source(KERNELS_C, "kernels"))
    data = (Path(art.path) / "artifact.so").read_bytes()
    manifest = decode_manifest((Path(art.path) / "manifest.json").read_bytes())
    kernels, meta = _signatures.host_products(data)
    assert kernels == art.kernels and set(meta["signatures"]) == set(kernels)
    assert backend_meta(meta) == manifest.meta


def test_a_kernel_not_found_says_what_it_most_likely_is(tmp_path, cxx):
    """A C++ function not ``extern "C"`` (its name mangled), and a build that exports no
    function at all (``-fvisibility=hidden``), each named in the error."""
    with pytest.raises(safejit.KernelNotFoundError, match=r"C\+\+ names are mangled: declare twice extern \"C\""):
        rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / "a"),)))
        rt.compile(safejit.Source("int twice(int x) { return 2 * x; }\n", "m", filename="m.cpp")).kernel("twice")
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / "b"),)))
    hidden = rt.compile(safejit.Source("int f(void) { return 1; }\n", "m"), flags=("-fvisibility=hidden",))
    with pytest.raises(safejit.KernelNotFoundError, match="the build exports no function"):
        hidden.kernel("f")
    with pytest.raises(safejit.KernelNotFoundError) as plain:
        rt.compile(safejit.Source("int f(void) { return 1; }\n", "m")).kernel("g")
    assert str(plain.value) == "no kernel 'g'; this module has ['f']"


def test_a_module_exporting_no_function_finds_none_of_its_dependencies(tmp_path):
    """A module that exports no function looked any name up in what it links: libc's
    ``getpid`` (or ``system``) came back as one of its kernels."""
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / "c"),)))
    code = "static int f(void) { return 1; }\nint (*exported)(void) = f;\n"
    module = rt.compile(safejit.Source(code, "m"))
    assert module.kernels == ()
    for name in ("getpid", "system", "exported"):
        with pytest.raises(safejit.KernelNotFoundError, match="the build exports no function"):
            module.kernel(name)
    rt.close()
