"""The one ELF reader (``backends/_elf.py``): the same answers as the three readers it
replaced, on real artifacts (gcc/g++ shared objects, NVRTC and nvcc cubins, objects
with Ascend meta sections), in every class and byte order; and only ``ElfError``
for bytes it cannot read."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from safejit.backends import _elf
from safejit.backends._elf import Elf, ElfError
from safejit.backends.ascend.backend import ascend_kernel_names
from safejit.backends.cuda.cubin import cubin_frame_sizes, cubin_kernels
from safejit.backends.host import elf_exported_functions
from safejit.errors import LoadError
from tests._elf_build import STB_GLOBAL, STB_LOCAL, STB_WEAK, STT_FUNC, STT_OBJECT, tiny_elf
from tests.unit.backends import _elf_before as before

C_SOURCE = """
#include <math.h>
int add(int a, int b) { return a + b; }
double wave(double x) { return sin(x) + cos(x); }
__attribute__((weak)) int maybe(void) { return 3; }
static int hidden_helper(int x) { return x * 3; }
__attribute__((visibility("hidden"))) int not_exported(int x) { return hidden_helper(x); }
int use(int x) { return not_exported(x); }
const int table[4] = {1, 2, 3, 4};
int counter;
"""
CXX_SOURCE = """
#include <vector>
#include <stdexcept>
template <typename T> T twice(T x) { return x + x; }
template int twice<int>(int);
extern "C" double total(const double* x, long n) {
  std::vector<double> v(x, x + n);
  if (n < 0) throw std::invalid_argument("n");
  double s = 0; for (double d : v) s += twice(d); return s;
}
namespace ns { int mangled(int x) { return x; } }
"""
CUDA_SOURCE = r"""
struct Big { double v[6]; };
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }
extern "C" __global__ void mixed(char c, short s, Big b, double* out, long long k) {
  out[threadIdx.x] = c + s + b.v[threadIdx.x % 6] + k; }
extern "C" __global__ void local(int* out, int n) {
  volatile int buf[64]; for (int i = 0; i < 64; ++i) buf[i] = i * n; out[threadIdx.x] = buf[(threadIdx.x * 7) % 64]; }
__device__ __noinline__ int helper(int x) { volatile int t[16]; t[x & 15] = x; return t[(x + 1) & 15]; }
extern "C" __global__ void calls(int* out) { out[threadIdx.x] = helper(threadIdx.x); }
template <typename T> __global__ void scale(T* x, T a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }
template __global__ void scale<float>(float*, float, int);
extern "C" __global__ void noargs() {}
"""


def _cc(work: Path, name: str, source: str, *argv: str, cxx: bool = False) -> bytes:
    src = work / (name + (".cpp" if cxx else ".c"))
    src.write_text(source)
    out = work / name
    subprocess.run(["c++" if cxx else "cc", *argv, "-o", str(out), str(src)], check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def host_artifacts(tmp_path_factory) -> dict[str, bytes]:
    """Real ELF files as the host backend makes them (``-shared -fPIC -O2 -fno-lto``), and others."""
    work = tmp_path_factory.mktemp("elf-host")
    shared = ("-shared", "-fPIC", "-O2", "-fno-lto")
    return {
        "c.so": _cc(work, "c.so", C_SOURCE, *shared, "-lm"),
        "c-stripped.so": _cc(work, "cs.so", C_SOURCE, *shared, "-lm", "-Wl,-s"),
        "cxx.so": _cc(work, "cxx.so", CXX_SOURCE, *shared, cxx=True),
        "c.o": _cc(work, "c.o", C_SOURCE, "-c", "-fPIC"),
        "c32.o": _cc(work, "c32.o", "int add(int a, int b) { return a + b; }\n", "-c", "-m32"),
        "exe": _cc(work, "exe", "int main(void) { return 0; }\n", "-O2"),
        "empty.so": _cc(work, "empty.so", "", *shared),
    }


def test_host_functions_are_what_the_reader_before_found(host_artifacts):
    for name, data in host_artifacts.items():
        assert _elf.dynsym_functions(data) == before._dynsym_functions(data), name
    assert elf_exported_functions(host_artifacts["c.so"]) == ("add", "maybe", "use", "wave")
    assert elf_exported_functions(host_artifacts["c-stripped.so"]) == ("add", "maybe", "use", "wave")
    assert elf_exported_functions(host_artifacts["cxx.so"])[:2] == ("_Z5twiceIiET_S0_", "_ZN2ns7mangledEi")
    assert "total" in elf_exported_functions(host_artifacts["cxx.so"])


@pytest.mark.parametrize("is64", [True, False])
@pytest.mark.parametrize("little", [True, False])
def test_host_functions_in_every_class_and_byte_order(is64, little):
    symbols = [
        ("f", STB_GLOBAL << 4 | STT_FUNC, 1),
        ("w", STB_WEAK << 4 | STT_FUNC, 1),
        ("local", STB_LOCAL << 4 | STT_FUNC, 1),
        ("undefined", STB_GLOBAL << 4 | STT_FUNC, 0),
        ("data", STB_GLOBAL << 4 | STT_OBJECT, 1),
        ("_init", STB_GLOBAL << 4 | STT_FUNC, 1),
        ("caf\u00e9", STB_GLOBAL << 4 | STT_FUNC, 0xFFF1),
    ]
    data = tiny_elf(is64=is64, little=little, symbols=symbols)
    assert _elf.dynsym_functions(data) == before._dynsym_functions(data) == ("caf\u00e9", "f", "w")
    elf = Elf(data)
    assert (elf.elf_class, elf.order) == (2 if is64 else 1, 1 if little else 2)
    dynsym = elf.section(".dynsym")
    assert dynsym is not None
    assert [(s.name, s.type, s.bind) for s in elf.symbols(dynsym)][1:3] == [("f", 2, 1), ("w", 2, 2)]


@pytest.fixture(scope="module")
def cubins(tmp_path_factory) -> dict[str, bytes]:
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    _, prog = nvrtc.nvrtcCreateProgram(CUDA_SOURCE.encode(), b"k.cu", 0, [], [])
    try:
        out = {}
        for name, opts in (("nvrtc", [b"-arch=sm_90"]), ("nvrtc-G", [b"-arch=sm_90", b"-G"])):
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, buf)
            out[name] = buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    nvcc = shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/local/bin:/usr/bin")
    if nvcc is not None:
        work = tmp_path_factory.mktemp("elf-cubin")
        (work / "k.cu").write_text(CUDA_SOURCE)
        subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(work / "k.cubin"), str(work / "k.cu")], check=True)
        out["nvcc"] = (work / "k.cubin").read_bytes()
    return out


def test_cubin_kernels_and_frames_are_what_the_readers_before_found(cubins):
    for name, cubin in cubins.items():
        kernels = cubin_kernels(cubin)
        assert kernels == before.cubin_kernels(cubin), name
        assert cubin_frame_sizes(cubin) == before.cubin_frame_sizes(cubin), name
        # (with -G a device function has its own .nv.info and .text sections: listed too, as before)
        assert set(kernels) - {"_Z6helperi"} == {"_Z5scaleIfEvPT_S0_i", "calls", "local", "mixed", "noargs", "saxpy"}
        assert kernels["saxpy"] == [(0, 4), (8, 8), (16, 8), (24, 4)], name
        assert kernels["mixed"] == [(0, 1), (2, 2), (8, 48), (56, 8), (64, 8)], name
        assert kernels["noargs"] == [], name
        frames = cubin_frame_sizes(cubin)
        if name == "nvrtc-G":  # (-G: no frame records in .nv.info, before as now)
            continue
        assert frames["calls"] >= 64 and any(fn.endswith("_Z6helperi") for fn in frames), name


def test_ascend_kernel_names_are_the_meta_sections(tmp_path, host_artifacts):
    obj = tmp_path / "k.o"
    obj.write_bytes(host_artifacts["c.o"])
    for name in ("add_custom", "mm_mix_aic", "mm_mix_aiv", "x"):
        subprocess.run(
            ["objcopy", "--add-section", f".ascend.meta.{name}=/dev/null", str(obj)], check=True, capture_output=True
        )
    data = obj.read_bytes()
    assert ascend_kernel_names(data) == ("add_custom", "mm", "x")
    assert ".ascend.meta.mm_mix_aic" in _elf.section_names(data)
    elftools = pytest.importorskip("elftools")
    assert elftools is not None
    for blob in [data, *host_artifacts.values()]:
        assert _elf.section_names(blob) == before.ascend_section_names(blob)


def test_sections_and_lookups_agree(host_artifacts):
    elf = Elf(host_artifacts["c.so"])
    sections = elf.sections()
    assert [s.name for s in sections] == _elf.section_names(host_artifacts["c.so"])
    text = elf.section(".text")
    assert text is not None and text in sections and elf.section("nope") is None
    assert elf.sections_named(".text", ".init", "nope") == {".text": text, ".init": elf.section(".init")}
    assert [s.name for s in elf.of_type(_elf.SHT_DYNSYM)] == [".dynsym"]
    assert elf.dynamic() is not None and elf.dynamic()[-1][0] != 0
    assert len(elf.section_data(text)) == text.size
    assert elf.at(text.addr, 4) == elf.section_data(text)[:4]
    assert Elf(host_artifacts["c.o"]).dynamic() is None  # (a relocatable object has no PT_DYNAMIC)


def test_eiattr_records_walk_every_format_and_stop_at_an_unknown_one():
    info = bytes([1, 0x10, 2, 0x11, 7, 3, 0x12, 1, 2, 4, 0x13, 3, 0, 9, 9, 9, 5, 0x14, 1, 0x15])
    assert list(_elf.eiattr_records(info)) == [
        (0x10, b""),
        (0x11, b"\x07"),
        (0x12, b"\x01\x02"),
        (0x13, b"\x09\x09\x09"),
    ]
    assert list(_elf.eiattr_records(bytes([4, 0x17, 0xFF, 0xFF, 1]))) == [(0x17, b"\x01")]  # cut short
    assert list(_elf.eiattr_records(bytes([4, 0x17, 1]))) == []


def _with(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, *values)
    return bytes(buf)


def test_malformed_files_raise_elf_error_only(host_artifacts):
    good = host_artifacts["c.so"]
    shoff = struct.unpack_from("<Q", good, 0x28)[0]
    bad = {
        "empty": b"",
        "magic": b"\x7fELG" + good[4:],
        "class": good[:4] + b"\x03" + good[5:],
        "byte order": good[:5] + b"\x00" + good[6:],
        "truncated header": good[:40],
        "truncated section table": good[: shoff + 10],
        "section table past 2**64": _with(good, 0x28, "<Q", 2**64 - 1),
        "entry size": _with(good, 0x3A, "<H", 40),
        "name table index": _with(good, 0x3E, "<H", 999),
        "program table": _with(good, 0x20, "<Q", 2**63),
    }
    for what, data in bad.items():
        readers = {
            "names": lambda d: _elf.section_names(d),
            "segments": lambda d: Elf(d).segments(),
            "functions": _elf.dynsym_functions,
        }
        if what == "name table index":  # (nothing here but the names reads it)
            del readers["segments"], readers["functions"]
        if what == "program table":  # (nothing here but the segments reads it)
            del readers["names"], readers["functions"]
        for reader in readers.values():
            with pytest.raises(ElfError):
                reader(data)
        with pytest.raises(LoadError):
            cubin_kernels(data if what != "program table" else b"")
        assert cubin_frame_sizes(data) == {} or what == "program table"


def test_a_string_table_without_an_end_or_out_of_range_is_an_elf_error():
    data = tiny_elf(symbols=[("f", STB_GLOBAL << 4 | STT_FUNC, 1)])
    elf = Elf(data)
    dynstr = elf.section(".dynstr")
    assert dynstr is not None
    unterminated = data[: dynstr.offset] + b"\0fff" + data[dynstr.offset + 4 :]  # "f\0" → "fff"
    with pytest.raises(ElfError):
        _elf.dynsym_functions(unterminated)
    dynsym = elf.section(".dynsym")
    assert dynsym is not None
    header = elf.sections().index(dynsym)
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    with pytest.raises(ElfError):
        _elf.dynsym_functions(_with(data, shoff + header * 64 + 40, "<I", 77))  # sh_link


@pytest.mark.parametrize("shape", ["one-long-name", "its-suffixes"])
def test_section_names_of_a_crafted_file_cost_bounded_memory(shape):
    """65,535 section headers each naming one 200 kB string (or a suffix of it): each name
    was decoded into a string of its own (~13 GB); the reader answers or raises ElfError."""
    import struct

    from safejit.backends._elf import Elf, ElfError

    n, length = 65535, 200_000
    shoff = 64
    table = shoff + n * 64
    ehdr = (
        b"\x7fELF"
        + bytes([2, 1, 1])
        + bytes(9)
        + struct.pack("<HHIQQQIHHHHHH", 1, 0, 1, 0, 0, shoff, 0, 64, 0, 0, 64, n, 1)
    )
    headers = b"".join(
        struct.pack("<IIQQQQIIQQ", 0 if shape == "one-long-name" else i, 3, 0, 0, table, length + 1, 0, 0, 1, 0)
        for i in range(n)
    )
    data = ehdr + headers + b".ascend.meta." + b"A" * (length - 13) + b"\0"
    if shape == "one-long-name":  # decoded once, the same string for every header
        names = Elf(data).names()
        assert len(names) == n and len({id(x) for x in names[1:]}) == 1
    else:
        with pytest.raises(ElfError):
            Elf(data).names()


def test_long_mangled_names_of_a_real_kernel_are_read():
    """A variadic-template kernel's mangled name runs to 20 kB, and hundreds of them to
    megabytes in all: the reader's bound is the string table's size, not a name length."""
    import struct

    from safejit.backends._elf import Elf

    names = [b".text._Z" + bytes([65 + i % 26]) * 20_000 for i in range(300)]
    table = b"\0" + b"\0".join(names) + b"\0"
    offsets = [0]  # (index 0's name, then each name's start)
    for i in range(len(names)):
        offsets.append(1 + sum(len(x) + 1 for x in names[:i]))
    shoff, n = 64, len(names) + 2
    ehdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    ehdr += struct.pack("<HHIQQQIHHHHHH", 1, 0, 1, 0, 0, shoff, 0, 64, 0, 0, 64, n, 1)
    start = shoff + n * 64
    headers = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    headers += struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, start, len(table), 0, 0, 1, 0)
    headers += b"".join(struct.pack("<IIQQQQIIQQ", off, 1, 0, 0, 0, 0, 0, 0, 1, 0) for off in offsets[1:])
    read = Elf(ehdr + headers + table).names()
    assert [x.encode() for x in read[2:]] == names
