"""Coverage-guided fuzzing of safejit's parsers of untrusted bytes (run by hand).

    pip install atheris
    python fuzz/fuzz_parsers.py -atheris_runs=200000                  # all parsers
    python fuzz/fuzz_parsers.py --seeds corpus/ corpus/ -max_total_time=600

The first byte of an input picks the parser (``TARGETS``), the rest is its input.
``--seeds DIR`` first writes real inputs into DIR (shared objects as the host
backend links them, an NVRTC cubin when NVRTC is installed, small ELF files of
every class and byte order), one per ELF parser, so that mutation starts from
files the readers accept. A crash is any exception other than the parser's
typed error, or a hang (libFuzzer's ``-timeout``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from safejit.backends import _elf, _load_time, _prototypes
    from safejit.backends._dwarf import DwarfError
    from safejit.backends.ascend.backend import ascend_kernel_names
    from safejit.backends.cuda.cubin import cubin_frame_sizes, cubin_kernels
    from safejit.backends.host import elf_exported_functions
    from safejit.cache.leaf import ManifestError, decode_manifest
    from safejit.closure.depfiles import parse_depfile, parse_single_rule
    from safejit.errors import LoadError
    from safejit.spec import LoadBaseline

#: gcc 12 / binutils 2.40 on x86-64 (what ``baseline_of`` reads from an empty link).
BASELINE = LoadBaseline(
    elf_class=2,
    byte_order=1,
    machine=62,
    init=23,
    fini=9,
    init_array=1,
    fini_array=1,
    ctors=0,
    dtors=0,
    startup_refs=("_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__cxa_finalize", "__gmon_start__"),
)


def _manifest(data: bytes) -> None:
    try:
        decode_manifest(data)
    except ManifestError:
        pass


def _depfile(data: bytes) -> None:
    parse_depfile(data.decode("utf-8", "replace"))


def _single_rule(data: bytes) -> None:
    try:
        parse_single_rule(data.decode("utf-8", "replace"))
    except ValueError:
        pass


def _load_error(fn):  # type: ignore[no-untyped-def]
    def run(data: bytes) -> None:
        try:
            fn(data)
        except LoadError:
            pass

    return run


def _cubin(data: bytes) -> None:
    _load_error(cubin_kernels)(data)
    if not isinstance(cubin_frame_sizes(data), dict):
        raise AssertionError("cubin_frame_sizes must return a dict")


def _walk(data: bytes) -> None:
    """Every reading the Elf object offers, each on its own."""
    try:
        elf = _elf.Elf(data)
    except _elf.ElfError:
        return
    for step in (elf.sections, elf.segments, elf.dynamic):
        try:
            step()
        except _elf.ElfError:
            pass
    try:
        sections = elf.sections()
    except _elf.ElfError:
        return
    for section in sections:
        try:
            if section.name.startswith(".nv.info"):  # (target 9 walks EIATTR records in any bytes)
                list(_elf.eiattr_records(elf.section_data(section)))
            elif section.type in (_elf.SHT_SYMTAB, _elf.SHT_DYNSYM):
                elf.symbols(section)
            else:
                elf.section_data(section)
        except _elf.ElfError:
            pass


def _host_prototypes(data: bytes) -> None:
    try:
        _prototypes.prototypes(data, {"add", "f", "g"})
    except DwarfError:
        pass


def _load_time_code(data: bytes) -> None:
    try:
        reasons = _load_time.load_time_code(data, BASELINE)
    except _elf.ElfError:
        return
    if not all(isinstance(r, str) for r in reasons):
        raise AssertionError("reasons must be text")


def _baseline(data: bytes) -> None:
    try:
        _load_time.baseline_of(data)
    except _elf.ElfError:
        pass


TARGETS = (
    _manifest,
    _depfile,
    _single_rule,
    _load_error(elf_exported_functions),
    _cubin,
    _load_error(ascend_kernel_names),
    _walk,
    _load_time_code,
    _baseline,
    lambda data: list(_elf.eiattr_records(data)),
    _host_prototypes,
)
#: The targets that read ELF files, which the seeds are for.
ELF_TARGETS = (3, 4, 5, 6, 7, 8, 10)


def one_input(data: bytes) -> None:
    if data:
        TARGETS[data[0] % len(TARGETS)](data[1:])


def _write_seeds(directory: str) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests._elf_build import tiny_elf

    os.makedirs(directory, exist_ok=True)
    seeds = {f"tiny-{c}{o}": tiny_elf(is64=c == 64, little=o == "le") for c in (32, 64) for o in ("le", "be")}
    with tempfile.TemporaryDirectory() as work:
        for name, code, extra in (
            ("empty", "", []),
            ("add", "int add(int a, int b) { return a + b; }\n", ["-lm"]),
            ("debug", "#include <stdint.h>\ndouble f(const double *x, int64_t n) { return x[n]; }\n", ["-g"]),
            ("ctor", "int x; __attribute__((constructor)) static void c(void) { x = 1; }\n", []),
            ("relr", "static int a, b;\nint* t[] = {&a, &b, &a, &b};\n", ["-Wl,-z,pack-relative-relocs"]),
            (
                "ifunc",
                "static int i(void) { return 1; }\nstatic int (*r(void))(void) { return i; }\n"
                'static int f(void) __attribute__((ifunc("r")));\nint g(void) { return f(); }\n',
                [],
            ),
        ):
            src, out = os.path.join(work, f"{name}.c"), os.path.join(work, f"{name}.so")
            with open(src, "w") as f:
                f.write(code)
            # (compact: no page alignment, no .symtab; the same tables the readers read)
            compact = ["-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=0x10", "-Wl,-z,common-page-size=0x10"]
            strip = [] if "-g" in extra else ["-Wl,-s"]  # (the DWARF reader's seed keeps its debug info)
            link = ["cc", "-shared", "-fPIC", "-O2", "-fno-lto", *compact, *strip, "-o", out, src, *extra]
            subprocess.run(link, check=True)
            with open(out, "rb") as f:
                seeds[name] = f.read()
    try:
        from cuda.bindings import nvrtc

        src = (
            b'extern "C" __global__ void k(float a, float* x, int n) '
            b"{ volatile int t[8]; t[n & 7] = n; x[n] = a * t[0]; }"
        )
        _, prog = nvrtc.nvrtcCreateProgram(src, b"k.cu", 0, [], [])
        nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        seeds["cubin"] = cubin
    except ImportError:
        pass
    for name, blob in seeds.items():
        for target in ELF_TARGETS:
            with open(os.path.join(directory, f"{name}-{target}"), "wb") as f:
                f.write(bytes([target]) + blob)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--seeds":
        _write_seeds(sys.argv[2])
        del sys.argv[1:3]
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
