"""The prototypes of a host build's functions, from its DWARF (``backends/_prototypes.py``
over ``backends/_dwarf.py``): every C type a call checks, C and C++ (by name, by
linkage name, through a specification or an abstract origin), DWARF 4 and 5, zlib-
compressed sections; what no call can check says why; no debug info is no prototype;
and the build's argv makes the same bytes in any work dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import safejit
from safejit.backends import _elf, _prototypes
from safejit.backends._dwarf import DwarfError
from safejit.backends._signatures import _GCC, host_products

TYPES_C = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
enum color { RED, GREEN };
enum sign { NEG = -1, POS = 1 };
typedef struct { int a; double b; } pair;
struct opaque;
int ints(signed char sc, unsigned char uc, char c, short s, unsigned short us, int i, unsigned u,
         long l, unsigned long ul, long long ll, size_t n, int8_t i8, uint64_t u64, bool b) { return 0; }
double reals(float f, double d, long double ld) { return d; }
void *pointers(const double *cd, double *d, void *v, const void *cv, char *s, const char *cs,
               uint8_t *bytes, pair *p, const pair *cp, struct opaque *o, double **pp,
               double m[][3], const int *const ci) { return v; }
int odd(enum color c, enum sign s, pair by_value, int (*callback)(int), float _Complex z, __int128 big, ...)
{ return 0; }
pair returns_struct(void) { pair p = {1, 2}; return p; }
int kr(a, f) int a; float f; { return a + (int)f; }
static int helper(int x) { return x * 2; }
int uses_helper(int x) { return helper(x) + 1; }
static inline int inlined(int y) { return y * 3; }
int inlined_too(int y) { return inlined(y); }
int calls_inlined(int y) { return inlined_too(y) + 1; }
"""

TYPES_CXX = r"""
#include <vector>
namespace k {
  int f(int x) { return x; }
  extern "C" int g(double y) { return (int)y; }
  struct S { static int m(long z); };
  int S::m(long z) { return (int)z; }
}
extern "C" double total(const double *x, int n) {
  std::vector<double> v(x, x + n); double s = 0; for (double d : v) s += d; return s; }
int overloaded(int a) { return a; }
int overloaded(double a) { return (int)a; }
"""


def _cc(work: Path, name: str, source: str, *argv: str, cxx: bool = False) -> bytes:
    src = work / (name + (".cpp" if cxx else ".c"))
    src.write_text(source)
    out = work / (name + ".so")
    cmd = ["c++" if cxx else "cc", "-shared", "-fPIC", "-O2", "-fno-lto", *argv, "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("prototypes")
    flags = [f for f in _GCC if not f.startswith("{")]
    return {
        "c": _cc(work, "c", TYPES_C, *flags),
        "c-dwarf4": _cc(work, "c4", TYPES_C, *flags, "-gdwarf-4"),
        "c-gz": _cc(work, "cz", TYPES_C, *flags, "-gz"),
        "c-plain-g": _cc(work, "cg", TYPES_C, "-g"),
        "c-none": _cc(work, "c0", TYPES_C),
        "cxx": _cc(work, "cxx", TYPES_CXX, *flags, cxx=True),
    }


def _of(data: bytes) -> dict[str, _prototypes.Prototype]:
    return _prototypes.prototypes(data, _elf.dynsym_functions(data))


def _codes(p: _prototypes.Prototype) -> list[str]:
    return [code for _, code, _ in p.params]


def test_every_scalar_and_pointer_type(built):
    found = _of(built["c"])
    assert _codes(found["ints"]) == [
        "i1", "u1", "ci1", "i2", "u2", "i4", "u4", "i8", "u8", "i8", "u8", "i1", "u8", "b"
    ]  # fmt: skip
    assert found["reals"].ret == ("f8", "double") and _codes(found["reals"]) == ["f4", "f8", "f16"]
    pointers = found["pointers"]
    assert pointers.ret == ("p:v", "void *")
    assert _codes(pointers) == [
        "pc:f8", "p:f8", "p:v", "pc:v", "p:ci1", "pc:ci1", "p:u1", "p:s16", "pc:s16", "p:s0", "p:p", "p:f8", "pc:i4"
    ]  # fmt: skip
    assert [(n, s) for n, _, s in pointers.params][:2] == [("cd", "const double *"), ("d", "double *")]
    assert pointers.params[-1][2] == "const int *const" and pointers.params[-2][2] == "double (*)[]"


def test_what_no_call_can_check_says_why(built):
    odd = _of(built["c"])["odd"]
    assert odd.varargs and _codes(odd)[:2] == ["u4", "i4"]  # enums: their underlying type
    assert _codes(odd)[2:] == [
        "!a struct, union or class passed by value", "!a function pointer", "!complex float", "!__int128"
    ]  # fmt: skip
    assert _of(built["c"])["returns_struct"].ret[0] == "!a struct, union or class passed by value"
    kr = _of(built["c"])["kr"]
    assert _codes(kr) == ["i4", "!a parameter of a definition without a prototype (promoted when called)"]


def test_a_definition_is_found_through_its_abstract_origin(built):
    found = _of(built["c"])
    assert found["inlined_too"].params == (("y", "i4", "int"),)  # also inlined into calls_inlined
    assert "helper" not in found  # (static: not exported, not wanted)


@pytest.mark.parametrize("variant", ["c-dwarf4", "c-gz", "c-plain-g"])
def test_dwarf_versions_compression_and_flags_agree(built, variant):
    assert _of(built[variant]) == _of(built["c"])


def test_cxx_by_name_and_linkage_name(built):
    found = _of(built["cxx"])
    assert found["g"].params == (("y", "f8", "double"),)  # extern "C" in a namespace
    assert found["_ZN1k1fEi"].params == (("x", "i4", "int"),)
    assert found["_ZN1k1S1mEl"].params == (("z", "i8", "long int"),)  # through DW_AT_specification
    assert found["_Z10overloadedi"].params[0][1] == "i4" and found["_Z10overloadedd"].params[0][1] == "f8"
    assert found["total"].params == (("x", "pc:f8", "const double *"), ("n", "i4", "int"))


def test_no_debug_info_is_no_prototype(built):
    assert _of(built["c-none"]) == {}
    assert host_products(built["c-none"]) == (_elf.dynsym_functions(built["c-none"]), {})


def test_unreadable_debug_info_is_a_dwarf_error(built):
    data = bytearray(built["c"])
    info = _elf.Elf(bytes(data)).section(".debug_info")
    assert info is not None
    data[info.offset : info.offset + 4] = b"\xf0\xff\xff\xff"  # a reserved unit length
    with pytest.raises(DwarfError, match="reserved length"):
        _of(bytes(data))
    kernels, meta = host_products(bytes(data))  # a build is not refused for it: no signatures
    assert "add" not in meta.get("signatures", {}) and "ints" in kernels


def test_the_same_inputs_make_the_same_bytes_in_any_work_dir(tmp_path):
    """The work dir is mapped out of the debug info (-fdebug-prefix-map)."""
    digests = set()
    for i in range(2):
        with safejit.Runtime(config=safejit.Config(cache_dirs=(str(tmp_path / f"c{i}"),))) as rt:
            digests.add(rt.build(safejit.Source(TYPES_C, "types")).digest)
    assert len(digests) == 1


def test_a_user_g0_does_not_turn_signatures_off(make_runtime):
    mod = make_runtime().compile(safejit.Source("int add(int a, int b) { return a + b; }", "add"), flags=("-g0",))
    assert mod.kernel("add").signature == "int add(int a, int b)"
