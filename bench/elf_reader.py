"""The ELF reader and the load-time analysis, each against the reader it replaced,
measured in the same run on the same artifacts.

    python bench/elf_reader.py [--json out.json]

Keys written (microseconds per call: the median of single calls, robust to a busy machine):
  host_functions_us / _before_us      exported functions of a host kernel (.dynsym), C and C++
  load_time_code_us                   the load-time analysis of that kernel (target: well under 100 us)
  host_compile_checks_us              both, as each host compile runs them
  cubin_kernels_us / _before_us       kernels and parameter layouts of an NVRTC sm_90 cubin
  cubin_frame_sizes_us / _before_us   stack frames of the same cubin
  section_names_us / _pyelftools_us   section names of an object (what Ascend reads; pyelftools if installed)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safejit.backends import _elf
from safejit.backends._load_time import baseline_of, load_time_code
from safejit.backends.cuda.cubin import cubin_frame_sizes, cubin_kernels
from tests.unit import _elf_before as before

C = """#include <math.h>
int add(int a, int b) { return a + b; }
double scale(double x, double k) { return x * k; }
void saxpy(int n, float a, const float* x, float* y) { for (int i = 0; i < n; ++i) y[i] = a * x[i] + y[i]; }
double wave(double x) { return sin(x); }
"""
CXX = """#include <vector>
#include <stdexcept>
extern "C" double total(const double* x, long n) {
  std::vector<double> v(x, x + n); if (n < 0) throw std::invalid_argument("n");
  double s = 0; for (double d : v) s += d; return s; }
"""
CUDA = b"""extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }
extern "C" __global__ void local(int* out, int n) {
  volatile int buf[64]; for (int i = 0; i < 64; ++i) buf[i] = i * n; out[threadIdx.x] = buf[threadIdx.x % 64]; }
"""


def _us(fn: Callable[[], object], number: int = 5000) -> float:
    times = []
    for _ in range(number):
        started = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1000


def _link(work: Path, name: str, code: str, cxx: bool = False) -> bytes:
    src = work / f"{name}.{'cpp' if cxx else 'c'}"
    src.write_text(code)
    out = work / f"{name}.so"
    argv = ["c++" if cxx else "cc", "-shared", "-fPIC", "-O2", "-fno-lto", "-o", str(out), str(src), "-lm"]
    subprocess.run(argv, check=True)
    return out.read_bytes()


def _cubin() -> bytes | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    _, prog = nvrtc.nvrtcCreateProgram(CUDA, b"k.cu", 0, [], [])
    nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    return cubin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = baseline_of(_link(work, "empty", ""))
        for lang, data in (("c", _link(work, "c", C)), ("cxx", _link(work, "cxx", CXX, cxx=True))):
            assert load_time_code(data, baseline) == []
            out[f"host_functions_{lang}_us"] = _us(lambda d=data: _elf.dynsym_functions(d))
            out[f"host_functions_{lang}_before_us"] = _us(lambda d=data: before._dynsym_functions(d))
            out[f"load_time_code_{lang}_us"] = _us(lambda d=data: load_time_code(d, baseline))
            out[f"host_compile_checks_{lang}_us"] = _us(
                lambda d=data: (_elf.dynsym_functions(d), load_time_code(d, baseline))
            )
            out[f"section_names_{lang}_us"] = _us(lambda d=data: _elf.section_names(d))
            with contextlib.suppress(ImportError):  # (pyelftools is no dependency any more)
                out[f"section_names_{lang}_pyelftools_us"] = _us(
                    lambda d=data: before.ascend_section_names(d), number=200
                )
    cubin = _cubin()
    if cubin is not None:
        out["cubin_kernels_us"] = _us(lambda: cubin_kernels(cubin))
        out["cubin_kernels_before_us"] = _us(lambda: before.cubin_kernels(cubin))
        out["cubin_frame_sizes_us"] = _us(lambda: cubin_frame_sizes(cubin))
        out["cubin_frame_sizes_before_us"] = _us(lambda: before.cubin_frame_sizes(cubin))
    for key, value in out.items():
        print(f"{key:40s} {value:8.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
