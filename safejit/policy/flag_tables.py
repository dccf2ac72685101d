"""The flag tables: per compiler family, every option a tenant may pass, spelled exactly.

One table per family — ``gcc`` (host C/C++, gcc or clang), ``nvcc``, ``nvrtc`` and
``bisheng`` (clang-based, Ascend) — each naming options that take no value
(``exact``) and options whose value is joined to the name, with the grammar that
value must match in full (``valued``: ``-O`` + ``[0-3sgz]|fast``, ``-std=`` + a
standard). Nothing is admitted by prefix: an option is in the table or it is
refused. :data:`REASONS` only words the refusal of options known to be dangerous;
it never admits anything.

Long for a module (the style's ~400 lines): it is data, and one place for it is the
point. An entry whose harmlessness is not obvious says why it is here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "BISHENG",
    "FAMILIES",
    "GCC",
    "LIBRARIES",
    "LINKER",
    "NVCC",
    "NVRTC",
    "PTXAS",
    "REASONS",
    "Family",
    "OptionTable",
    "family",
]


class Grammar:
    """A regular expression compiled on first use: a process uses few of the tables'
    grammars, and compiling them all cost ~15 ms of the first compile's (or hit's)."""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def fullmatch(self, text: str) -> re.Match[str] | None:
        compiled = self._compiled
        if compiled is None:  # (a race compiles it twice, to the same pattern)
            compiled = self._compiled = re.compile(self.pattern)
        return compiled.fullmatch(text)

    def __repr__(self) -> str:
        return f"Grammar({self.pattern!r})"


def _re(pattern: str) -> Grammar:
    return Grammar(pattern)


def _words(*words: str) -> Grammar:
    return Grammar("|".join(re.escape(w) for w in words))


def _list(item: str) -> Grammar:
    """A comma-separated list of ``item``."""
    return Grammar(f"(?:{item})(?:,(?:{item}))*")


_NUM: Final = _re(r"[0-9]{1,6}")
_BOOL: Final = _words("true", "false")
#: A CPU or architecture name (-march=icelake-server, x86-64-v3, armv8.2-a+sve2):
#: letters, digits and ._+- only, so never a path, an option or shell text.
_CPU: Final = _re(r"[a-z][a-z0-9_.+-]{0,63}")
#: A warning name with an optional level: -Wall, -Wno-unused, -Werror=format, -Wformat=2,
#: -Wc++17-extensions, -WCL4 (clang). No comma: -Wl, -Wa, and -Wp, never match.
_WARNING: Final = _re(r"(?:no-)?(?:error=)?[A-Za-z0-9][A-Za-z0-9+_.-]{0,80}(?:=[A-Za-z0-9_.+-]{1,32})?")
_IDENT: Final = _re(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True, slots=True)
class OptionTable:
    """Options spelled exactly (``exact``), or a name and a joined value that matches
    the name's grammar in full (``valued``)."""

    exact: frozenset[str]
    valued: Mapping[str, Grammar] = field(default_factory=dict)

    def admits(self, option: str) -> bool:
        if option in self.exact:
            return True
        return any(option.startswith(n) and g.fullmatch(option[len(n) :]) for n, g in self.valued.items())


@dataclass(frozen=True, slots=True)
class Family:
    """What one compiler family takes from a tenant."""

    name: str
    options: OptionTable
    #: Path-bearing options (``-I``, ``-include``…): confined to the declared roots and
    #: anchored, joined (``-I/x``) or separate (``-I /x``). Longest first.
    path_flags: tuple[str, ...] = ()
    #: ``-D``/``-U`` as macro definitions (C identifiers; values without NUL or newline).
    macros: bool = True
    #: ``-l<name>``: the names admitted (:data:`LIBRARIES`).
    libraries: frozenset[str] = frozenset()
    #: ``-Wl,`` options, each from :data:`LINKER`.
    linker: bool = False
    #: Options whose value is ptxas options, each from :data:`PTXAS`: a comma-separated
    #: list when ``ptxas_lists`` (nvcc splits at commas; NVRTC passes one option on).
    ptxas: tuple[str, ...] = ()
    ptxas_lists: bool = True
    #: Options whose meaning depends on the machine: admitted only to be resolved by the
    #: backend into what they mean here (DESIGN.md §4), never passed on as they are.
    machine: frozenset[str] = frozenset()


def _both(*features: str) -> set[str]:
    """``-m<f>`` and ``-mno-<f>`` for each feature."""
    return {f"-m{f}" for f in features} | {f"-mno-{f}" for f in features}


def _pairs(*names: str) -> set[str]:
    """``-f<n>`` and ``-fno-<n>`` for each name."""
    return {f"-f{n}" for n in names} | {f"-fno-{n}" for n in names}


# -- gcc / clang (host C and C++) ---------------------------------------------------

#: x86 ISA extensions (gcc 12–14, clang): each only lets the compiler emit those
#: instructions. Every one that ``-march=native`` expands to must be here, so that
#: its resolution can also be spelled out by hand (and keys the same).
_X86_ISA: Final = (
    "3dnow", "3dnowa", "abm", "adx", "aes", "amx-bf16", "amx-complex", "amx-fp16", "amx-int8",
    "amx-tile", "apxf", "avx", "avx10.1", "avx10.1-256", "avx10.1-512", "avx2", "avx5124fmaps",
    "avx5124vnniw", "avx512bf16", "avx512bitalg", "avx512bw", "avx512cd", "avx512dq", "avx512er",
    "avx512f", "avx512fp16", "avx512ifma", "avx512pf", "avx512vbmi", "avx512vbmi2", "avx512vl",
    "avx512vnni", "avx512vp2intersect", "avx512vpopcntdq", "avxifma", "avxneconvert", "avxvnni",
    "avxvnniint16", "avxvnniint8", "bmi", "bmi2", "cldemote", "clflushopt", "clwb", "clzero",
    "cmpccxadd", "crc32", "cx16", "enqcmd", "f16c", "fma", "fma4", "fsgsbase", "fxsr", "gfni",
    "hle", "hreset", "kl", "lwp", "lzcnt", "mmx", "movbe", "movdir64b", "movdiri", "mwaitx",
    "pclmul", "pconfig", "pku", "popcnt", "prefetchi", "prefetchwt1", "prfchw", "ptwrite",
    "raoint", "rdpid", "rdrnd", "rdseed", "rtm", "sahf", "serialize", "sgx", "sha", "sha512",
    "shstk", "sm3", "sm4", "sse", "sse2", "sse3", "sse4", "sse4.1", "sse4.2", "sse4a", "ssse3",
    "tbm", "tsxldtrk", "uintr", "usermsr", "vaes", "vpclmulqdq", "vzeroupper", "waitpkg",
    "wbnoinvd", "widekl", "xop", "xsave", "xsavec", "xsaveopt", "xsaves",
)  # fmt: skip

_GCC_EXACT: Final = frozenset(
    {
        # optimisation and debug levels
        *("-O", "-O0", "-O1", "-O2", "-O3", "-Os", "-Og", "-Oz"),
        *("-g", "-g0", "-g1", "-g2", "-g3", "-ggdb", "-ggdb1", "-ggdb2", "-ggdb3", "-gdwarf-4", "-gdwarf-5"),
        "-gline-tables-only",  # (clang)
        "-gno-record-gcc-switches",  # records less, never more
        "-gz",  # compressed debug sections
        # language and diagnostics
        *("-ansi", "-pedantic", "-pedantic-errors", "-w"),
        # floating point: codegen only. Not -ffast-math, -Ofast, -funsafe-math-optimizations:
        # gcc then links crtfastmath.o, shared objects too, whose initialiser sets
        # flush-to-zero for the host process at load. Their parts are here.
        *("-fno-fast-math", "-fno-unsafe-math-optimizations"),
        *_pairs("finite-math-only", "math-errno", "signed-zeros"),
        *_pairs("trapping-math", "associative-math", "reciprocal-math", "rounding-math", "signaling-nans"),
        *("-fcx-limited-range", "-fcx-fortran-rules", "-fsingle-precision-constant", "-ffloat-store"),
        # loops, inlining, vectorisation: codegen only
        *_pairs("unroll-loops", "unroll-all-loops", "peel-loops", "inline", "inline-functions"),
        *_pairs("inline-small-functions", "tree-vectorize", "tree-slp-vectorize", "tree-loop-vectorize"),
        *_pairs("vectorize", "slp-vectorize"),  # (clang)
        *_pairs("omit-frame-pointer", "strict-aliasing", "strict-overflow", "wrapv", "trapv"),
        *_pairs("delete-null-pointer-checks", "zero-initialized-in-bss", "gcse", "prefetch-loop-arrays"),
        # code model for a shared object: -fPIC/-fpic only (the backend passes -fPIC; a
        # position-dependent object would not link into one)
        *("-fPIC", "-fpic"),
        *_pairs("plt", "semantic-interposition", "common", "function-sections", "data-sections"),
        "-fvisibility-inlines-hidden",
        # C/C++ language features
        *_pairs("builtin", "exceptions", "rtti", "threadsafe-statics", "elide-constructors", "char8_t"),
        *_pairs("sized-deallocation", "aligned-new", "gnu-keywords", "gnu89-inline", "operator-names"),
        *_pairs("ms-extensions", "dollars-in-identifiers", "short-enums", "coroutines", "ident"),
        *("-ffreestanding", "-fhosted", "-fsigned-char", "-funsigned-char", "-fpermissive", "-fstrict-enums"),
        *_pairs("asynchronous-unwind-tables", "unwind-tables"),
        # hardening: codegen only
        *("-fstack-protector", "-fstack-protector-strong", "-fstack-protector-all", "-fno-stack-protector"),
        *_pairs("stack-clash-protection"),
        "-fcf-protection",
        # diagnostics output (to the log only)
        # (no caret: a #line directive names any file, and gcc reopens it to quote a line)
        *_pairs("diagnostics-color", "diagnostics-show-option", "show-column"),
        "-fno-diagnostics-show-caret",
        # OpenMP: links the toolchain's libgomp (see LIBRARIES), whose initialiser only reads
        # this process's OMP_* settings; -fopenmp-simd uses no runtime at all.
        *("-fopenmp", "-fopenmp-simd"),
        # safejit passes -fno-lto itself (-flto is refused)
        "-fno-lto",
        # machine: instruction sets and codegen, nothing that reads or writes a file
        *_both(*_X86_ISA),
        *("-m64", "-mstackrealign", "-mgeneral-regs-only", "-mred-zone", "-mno-red-zone"),
        *_both("strict-align", "outline-atomics"),  # (aarch64)
        # linking a shared object: -shared is what the backend passes; libgcc linked in
        # statically is the toolchain's own (-static and -static-libstdc++, which links
        # libstdc++'s initialisers into the kernel, are refused)
        *("-shared", "-rdynamic", "-static-libgcc", "-pthread"),
    }
)

_GCC_VALUED: Final = {
    "-march=": _CPU,
    "-mtune=": _CPU,
    "-mcpu=": _CPU,
    "-std=": _words(
        *("c89", "c90", "c99", "c11", "c17", "c18", "c2x", "c23"),
        *("gnu89", "gnu90", "gnu99", "gnu11", "gnu17", "gnu18", "gnu2x", "gnu23"),
        *("c++98", "c++03", "c++11", "c++14", "c++17", "c++20", "c++2a", "c++23", "c++2b", "c++26", "c++2c"),
        *("gnu++98", "gnu++03", "gnu++11", "gnu++14", "gnu++17", "gnu++20", "gnu++2a", "gnu++23", "gnu++2b"),
        *("gnu++26", "gnu++2c"),
    ),
    "-W": _WARNING,
    "-gz=": _words("none", "zlib", "zstd"),
    "-fvisibility=": _words("default", "hidden", "protected", "internal"),
    "-ffp-contract=": _words("fast", "on", "off", "fast-honor-pragmas"),
    "-fexcess-precision=": _words("fast", "standard", "16"),
    "-fcf-protection=": _words("full", "branch", "return", "none", "check"),
    "-fvect-cost-model=": _words("unlimited", "dynamic", "cheap", "very-cheap"),
    "-fsimd-cost-model=": _words("unlimited", "dynamic", "cheap", "very-cheap"),
    "-ftrivial-auto-var-init=": _words("zero", "pattern", "uninitialized"),
    "-fdiagnostics-color=": _words("always", "never", "auto"),
    "-ffp-model=": _words("precise", "strict"),  # (clang; =fast is -ffast-math)
    "-fdenormal-fp-math=": _words("ieee", "preserve-sign", "positive-zero"),  # (clang)
    # compile-time limits: the compile runs under its own limits anyway
    **dict.fromkeys(("-fmax-errors=", "-ferror-limit=", "-ftemplate-depth=", "-fconstexpr-depth="), _NUM),
    **dict.fromkeys(("-fconstexpr-steps=", "-fconstexpr-loop-limit=", "-fconstexpr-ops-limit="), _NUM),
    **dict.fromkeys(("-finline-limit=", "-fmessage-length=", "-fabi-version="), _NUM),
    **dict.fromkeys(("-falign-functions=", "-falign-loops=", "-falign-jumps=", "-falign-labels="), _NUM),
    "-fno-builtin-": _IDENT,
    "-mfpmath=": _words("sse", "387", "both", "sse+387", "387+sse"),
    "-mprefer-vector-width=": _words("none", "128", "256", "512"),
    "-mcmodel=": _words("small", "medium", "large"),
    "-mtls-dialect=": _words("gnu", "gnu2", "trad", "desc"),
    "-msve-vector-bits=": _words("scalable", "128", "256", "512", "1024", "2048"),  # (aarch64)
    "-mbranch-protection=": _re(r"none|standard|bti|pac-ret(?:\+leaf|\+b-key|\+bti)*"),  # (aarch64)
    # what -march=native / -mtune=native resolve to besides -m options (gcc: cache sizes)
    "--param=": _re(r"(?:l1-cache-size|l1-cache-line-size|l2-cache-size)=[0-9]{1,9}"),
}

#: The ``-l`` names the host backend admits: the toolchain's own runtime libraries, found
#: in the toolchain's library dirs, hashed into the closure like any link input. A name
#: off this list could pull any library of the system's dirs into the host process at
#: load (libSegFault's signal handlers, libmemusage's malloc hooks and exit-time file,
#: a sanitizer runtime), and its initialisers would run there.
LIBRARIES: Final = frozenset(
    {
        "m",  # libm: the C maths library (glibc)
        "rt",  # librt: clocks, timers, shm_open (glibc; an empty stub since 2.34)
        "pthread",  # libpthread (glibc; a stub since 2.34): threads
        "dl",  # libdl (glibc; a stub since 2.34): dlopen, dlsym
        "atomic",  # libatomic (gcc): atomics wider than the CPU's own
        "stdc++",  # libstdc++ (gcc): the C++ runtime, which C++ sources link anyway
        "gomp",  # libgomp (gcc): OpenMP's runtime, as -fopenmp links it
        "quadmath",  # libquadmath (gcc): __float128 maths
    }
)

GCC: Final = Family(
    name="gcc",
    options=OptionTable(_GCC_EXACT, _GCC_VALUED),
    path_flags=("-isystem", "-iquote", "-idirafter", "-include", "-I"),
    libraries=LIBRARIES,
    linker=True,
    machine=frozenset({"-march=native", "-mtune=native", "-mcpu=native"}),
)

# -- the linker, behind gcc's -Wl, --------------------------------------------------

#: ``-Wl,`` options: none takes a path (no -rpath, -soname, scripts, maps, plugins), none
#: makes the host process run or find anything at load (no -init, -z execstack, -z
#: interpose, --no-as-needed). ``-z`` and ``--exclude-libs`` take the next part as value.
LINKER: Final = OptionTable(
    frozenset(
        {
            *("--as-needed", "--gc-sections", "--no-gc-sections", "--no-undefined"),
            *("-Bsymbolic", "-Bsymbolic-functions", "-E", "--export-dynamic"),
            *("-s", "-S", "--strip-all", "--strip-debug", "-O0", "-O1", "-O2"),
            *("--build-id", "--eh-frame-hdr", "--no-allow-shlib-undefined"),
            *("--sort-common", "--warn-common", "--fatal-warnings", "--no-fatal-warnings"),
        }
    ),
    {
        "--build-id=": _re(r"none|md5|sha1|uuid|fast|0x[0-9a-fA-F]{1,64}"),
        "--hash-style=": _words("gnu", "sysv", "both"),
        "--icf=": _words("all", "safe", "none"),
        "--compress-debug-sections=": _words("none", "zlib", "zlib-gnu", "zlib-gabi", "zstd"),
        "--exclude-libs=": _re(r"[A-Za-z0-9_.+-]{1,64}(?::[A-Za-z0-9_.+-]{1,64})*"),
    },
)
#: Linker options whose value is the next ``-Wl,`` part, and its grammar.
LINKER_NEXT: Final = {
    "-z": _words(
        *("now", "lazy", "relro", "norelro", "noexecstack", "defs", "text", "separate-code", "noseparate-code"),
        *("combreloc", "nocombreloc"),
    ),
    "--exclude-libs": LINKER.valued["--exclude-libs="],
}

# -- ptxas, behind nvcc's and NVRTC's --ptxas-options -------------------------------

#: ptxas options: none writes a file (-o, --output-file), reads one (--options-file,
#: --input-as-string) or changes what kind of output is made (-c, -ewp, --preserve-relocs).
PTXAS: Final = OptionTable(
    frozenset(
        {
            *("-v", "--verbose", "-O0", "-O1", "-O2", "-O3"),
            *("--warn-on-spills", "-warn-spills", "--warn-on-local-memory-usage", "-warn-lmem-usage"),
            *("--warn-on-double-precision-use", "-warn-double-usage"),
            *("--suppress-stack-size-warning", "-suppress-stack-size-warning", "--sp-bounds-check"),
        }
    ),
    {
        **dict.fromkeys(("-maxrregcount=", "--maxrregcount="), _NUM),
        **dict.fromkeys(("--allow-expensive-optimizations=", "-allow-expensive-optimizations="), _BOOL),
        **dict.fromkeys(("--def-load-cache=", "-dlcm="), _words("ca", "cg", "cs", "lu", "cv")),
        **dict.fromkeys(("--def-store-cache=", "-dscm="), _words("wb", "cg", "cs", "wt")),
        "--opt-level=": _re("[0-3]"),
        "--device-stack-protector=": _BOOL,
    },
)

# -- nvcc ---------------------------------------------------------------------------

_NVCC_WERROR: Final = (
    "cross-execution-space-call", "reorder", "default-stream-launch", "missing-launch-bounds",
    "ext-lambda-captures-this", "deprecated-declarations", "all-warnings",
)  # fmt: skip


def _dash_forms(names: Iterable[str]) -> set[str]:
    """nvcc and NVRTC take each long option with one dash or two."""
    return {f"-{n}" for n in names} | {f"--{n}" for n in names}


def _valued_forms(names: Iterable[str], grammar: Grammar) -> dict[str, Grammar]:
    return {f"{dash}{n}=": grammar for n in names for dash in ("-", "--")}


#: nvcc compiles with --cubin and -arch=<arch> from safejit: every phase, architecture,
#: output, host-compiler, linker and file option is refused; what is left changes code
#: generation and diagnostics. Every value grammar is free of the characters nvcc's
#: shell would interpret (the backend checks the final argv again).
NVCC: Final = Family(
    name="nvcc",
    options=OptionTable(
        frozenset(
            {
                *("-G", "--device-debug", "-lineinfo", "--generate-line-info"),
                *_dash_forms(("use_fast_math", "extra-device-vectorization", "expt-relaxed-constexpr")),
                *_dash_forms(("extended-lambda", "restrict", "Wreorder", "Wdefault-stream-launch")),
                *_dash_forms(("Wmissing-launch-bounds", "Wext-lambda-captures-this")),
                *_dash_forms(("Wno-deprecated-declarations", "Wno-deprecated-gpu-targets")),
                "--expt-extended-lambda",
                *("-w", "--disable-warnings", "-res-usage", "--resource-usage"),
                *("--display-error-number", "-err-no", "--no-display-error-number", "-no-err-no"),
                *("--no-host-device-initializer-list", "--no-host-device-move-forward"),
                # non-relocatable: what safejit builds anyway (true would make a cubin that
                # needs a device link before it can be loaded)
                *("-rdc=false", "--relocatable-device-code=false"),
                # the host optimisation level (no host code is compiled with --cubin)
                *("-O0", "-O1", "-O2", "-O3"),
            }
        ),
        {
            **_valued_forms(("maxrregcount",), _NUM),
            **_valued_forms(("ftz", "prec-div", "prec-sqrt", "fmad", "device-stack-protector"), _BOOL),
            **_valued_forms(("dopt",), _words("on", "off")),
            **_valued_forms(("std",), _words("c++03", "c++11", "c++14", "c++17", "c++20")),
            **_valued_forms(("Werror",), _list("|".join(_NVCC_WERROR))),
            **_valued_forms(("diag-suppress", "diag-warn", "diag-error"), _list("[0-9]{1,6}")),
            "--brief-diagnostics=": _BOOL,
            "-brief-diag=": _BOOL,
            "--Ofast-compile=": _words("0", "min", "mid", "max"),
            "-Ofc=": _words("0", "min", "mid", "max"),
            "--jump-table-density=": _re(r"[0-9]{1,3}"),
            "-jtd=": _re(r"[0-9]{1,3}"),
            **_valued_forms(("frandom-seed",), _re(r"[A-Za-z0-9_]{1,64}")),
            **_valued_forms(("default-stream",), _words("legacy", "null", "per-thread")),
        },
    ),
    # (nvcc knows neither -iquote nor -idirafter nor -imacros)
    path_flags=("-isystem", "-include", "-I"),
    ptxas=("-Xptxas=", "--ptxas-options="),
)

# -- NVRTC --------------------------------------------------------------------------

#: NVRTC (nvrtc.h, "Supported Compile Options", CUDA 13): no process and no shell, but
#: in-process options must not touch files (--time, --fdevice-time-trace, PCH,
#: --use-bundled-headers) or this process (--modify-stack-limit=true changes its rlimit,
#: --split-compile starts threads), and headers are handed over in memory (no -I,
#: --pre-include: a path would be read from disk, unrecorded).
NVRTC: Final = Family(
    name="nvrtc",
    options=OptionTable(
        frozenset(
            {
                *("-G", "--device-debug", "-lineinfo", "--generate-line-info"),
                *_dash_forms(("use_fast_math", "extra-device-vectorization", "restrict", "Wreorder")),
                *_dash_forms(("fno-signed-zeros", "ffinite-math-only", "device-int128", "device-float128")),
                *_dash_forms(("Wconversion", "minimal", "no-source-include", "no-cache")),
                *("-default-device", "--device-as-default-execution-space", "-w", "--disable-warnings"),
                *("--display-error-number", "-err-no", "--no-display-error-number", "-no-err-no"),
                *("-rdc=false", "--relocatable-device-code=false", "-dw", "--device-w"),
            }
        ),
        {
            # (NVRTC takes a long option with two dashes, or its documented short name)
            **_valued_forms(("maxrregcount", "fmax-errors"), _NUM),
            **_valued_forms(("ftz", "prec-div", "prec-sqrt", "fmad", "device-stack-protector"), _BOOL),
            **_valued_forms(("builtin-move-forward", "builtin-initializer-list"), _BOOL),
            "--modify-stack-limit=": _words("false"),
            "-modify-stack-limit=": _words("false"),
            **_valued_forms(("dopt",), _words("on", "off")),
            **_valued_forms(("std",), _words("c++03", "c++11", "c++14", "c++17", "c++20", "c++23")),
            **dict.fromkeys(("--Ofast-compile=", "-Ofc="), _words("0", "min", "mid", "max")),
            **dict.fromkeys(("--jump-table-density=", "-jtd="), _re(r"[0-9]{1,3}")),
            **_valued_forms(("frandom-seed",), _re(r"[A-Za-z0-9_]{1,64}")),
            **_valued_forms(("diag-suppress", "diag-warn", "diag-error"), _list("[0-9]{1,6}")),
            **dict.fromkeys(
                ("--warning-as-error=", "-Werror="), _list("all-warnings|reorder|deprecated-declarations|conversion")
            ),
            **dict.fromkeys(("--optimization-info=", "-opt-info="), _words("inline")),
            **dict.fromkeys(("--brief-diagnostics=", "-brief-diag="), _BOOL),
        },
    ),
    path_flags=(),
    ptxas=("-Xptxas=", "--ptxas-options="),
    ptxas_lists=False,
)

# -- bisheng (Ascend; clang-based, compile step only) -------------------------------

#: bisheng compiles device code to a relocatable object (-c): no linking, no host
#: machine options. --cce-* options are listed one by one (--cce-auto-sync-log=<file>
#: writes a file); -mllvm passes raw options to LLVM (-info-output-file writes one).
BISHENG: Final = Family(
    name="bisheng",
    options=OptionTable(
        frozenset(
            {
                *("-O0", "-O1", "-O2", "-O3", "-g", "-g0", "-w"),
                *_pairs("fast-math", "strict-aliasing", "unroll-loops", "exceptions", "rtti", "builtin"),
                "--cce-auto-sync",
            }
        ),
        {
            "-std=": _words("c++11", "c++14", "c++17", "c++20", "gnu++11", "gnu++14", "gnu++17", "gnu++20"),
            "--std=": _words("c++11", "c++14", "c++17", "c++20", "gnu++11", "gnu++14", "gnu++17", "gnu++20"),
            "-W": _WARNING,
        },
    ),
    path_flags=("-isystem", "-iquote", "-idirafter", "-include", "-I"),
)

FAMILIES: Final = {f.name: f for f in (GCC, NVCC, NVRTC, BISHENG)}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"no flag family {name!r}; known: {sorted(FAMILIES)}") from None


#: Why options known to be dangerous are refused (longest prefix wins). Wording only:
#: whatever is not in a family's table is refused, whether or not it is named here.
_FAST_MATH_PARTS: Final = (
    "; its parts are admitted: -fno-math-errno -ffinite-math-only -fno-signed-zeros -fno-trapping-math "
    "-fassociative-math -freciprocal-math"
)
REASONS: Final = {
    # running programs
    "-fcompare-debug": "runs a second compile with options of its own (-wrapper, -fplugin...)",
    "-wrapper": "runs another program",
    "--wrapper": "runs another program",
    "-fplugin": "loads a plugin into the compiler",
    "-fpass-plugin": "loads a plugin into the compiler",
    "-iplugindir": "chooses where plugins are loaded from",
    "-fmodule-mapper": "runs a program or reads a mapper file",
    "-specs": "reads a spec file, which can run programs",
    "--specs": "reads a spec file, which can run programs",
    "@": "reads a response file",
    "--options-file": "reads a response file",
    "-optf": "reads a response file",
    "--config": "reads a driver configuration file",
    "-ccc-": "changes how the driver finds and runs its programs",
    "-B": "swaps the compiler's programs",
    "--prefix": "swaps the compiler's programs",
    "-ccbin": "swaps the host compiler",
    "--compiler-bindir": "swaps the host compiler",
    "-fuse-ld": "swaps the linker",
    "--ld-path": "swaps the linker",
    "-fuse-linker-plugin": "loads the LTO plugin into the linker",
    "--run": "runs the program it builds",
    "-run": "runs the program it builds",
    "--run-args": "runs the program it builds",
    "--archiver-binary": "runs another program",
    "-arbin": "runs another program",
    # raw options to sub-tools
    "-X": "passes raw options to a sub-tool",
    "--compiler-options": "passes raw options to the host compiler",
    "--linker-options": "passes raw options to the linker",
    "--nvlink-options": "passes raw options to nvlink",
    "--archive-options": "passes raw options to the archiver",
    "--forward-unknown": "passes unknown options to the host compiler",
    "-Wa,": "passes raw options to the assembler",
    "-Wp,": "passes raw options to the preprocessor",
    "-mllvm": "passes raw options to LLVM (some write files)",
    "-z": "passes a raw keyword to the linker",
    # writing or reading files elsewhere
    "-o": "redirects output",
    "--output": "redirects output",
    "-odir": "redirects output",
    "--keep": "keeps intermediate files elsewhere",
    "-keep": "keeps intermediate files elsewhere",
    "-save-temps": "writes intermediate files",
    "--save-temps": "writes intermediate files",
    "-M": "writes dependency files",
    "--dependency-output": "writes dependency files",
    "--generate-dependencies": "writes dependency files",
    "-fdeps-": "writes dependency files",
    "-dump": "writes files elsewhere",
    "-fdump": "writes files elsewhere",
    "-fopt-info": "writes files elsewhere",
    "-fsave-optimization-record": "writes files elsewhere",
    "-fstack-usage": "writes files elsewhere",
    "-fcallgraph-info": "writes files elsewhere",
    "-ftime-trace": "writes files elsewhere",
    "--time": "writes a file",
    "-time": "writes a file",
    "--fdevice-time-trace": "writes a file",
    "-fdevice-time-trace": "writes a file",
    "-fdiagnostics-format": "can write a file",
    "-fprofile": "reads or writes profile files",
    "--coverage": "writes profile files from the host process at exit",
    "-ftest-coverage": "writes files elsewhere",
    "-fauto-profile": "reads a profile file",
    "-fcrash-diagnostics-dir": "writes files elsewhere",
    "-fmodule": "reads or writes module files elsewhere",
    "-fprebuilt-module-path": "reads files elsewhere",
    "-include-pch": "reads a precompiled header",
    # (gcc reads -imacros files before every -include, so before safejit's guard: their
    # .gch, the compiler's binary state, would be loaded, and no depfile names it)
    "-imacros": "may load a precompiled header (.gch) no dependency list names",
    "--pch": "reads or writes precompiled headers",
    "-pch": "reads or writes precompiled headers",
    "--create-pch": "writes a precompiled header",
    "-create-pch": "writes a precompiled header",
    "--use-pch": "reads a precompiled header",
    "-use-pch": "reads a precompiled header",
    "--pch-dir": "reads or writes precompiled headers",
    "-pch-dir": "reads or writes precompiled headers",
    "--use-bundled-headers": "writes headers into a directory",
    "--cce-auto-sync-log": "writes a file",
    "-gsplit-dwarf": "writes debug info to a second file, outside the artifact",
    "--sysroot": "swaps the system root",
    "-isysroot": "swaps the system root",
    "-iprefix": "re-roots includes",
    "-iwithprefix": "re-roots includes",
    "-L": "adds library dirs whose contents are not tracked",
    "--library-path": "adds library dirs whose contents are not tracked",
    "--library-directory": "adds library dirs whose contents are not tracked",
    "--libdevice-directory": "swaps libdevice",
    "-ldir": "swaps libdevice",
    "--include-path": "is a long spelling: use -I (NVRTC: include_dirs=)",
    "--pre-include": "is a long spelling: use -include",
    "--system-include": "is a long spelling: use -isystem",
    "--define-macro": "is a long spelling: use -D",
    "--undefine-macro": "is a long spelling: use -U",
    "-fdebug-prefix-map": "rewrites recorded paths with unconfinable path text",
    "-ffile-prefix-map": "rewrites recorded paths with unconfinable path text",
    "-fmacro-prefix-map": "rewrites recorded paths with unconfinable path text",
    "-frecord-gcc-switches": "records this machine's paths in the artifact",
    # effects in the host process at load
    "-ffast-math": "links crtfastmath.o, whose initialiser sets flush-to-zero in the host process at load"
    + _FAST_MATH_PARTS,
    "-Ofast": "links crtfastmath.o, whose initialiser sets flush-to-zero in the host process at load"
    + _FAST_MATH_PARTS,
    "-funsafe-math-optimizations": "links crtfastmath.o, whose initialiser sets flush-to-zero in the host process"
    + _FAST_MATH_PARTS,
    "-ffp-model=fast": "links crtfastmath.o, whose initialiser sets flush-to-zero in the host process at load"
    + _FAST_MATH_PARTS,
    "-mpc": "links crtprec*.o, whose initialiser sets the x87 precision of the host process at load",
    "-fsanitize": "links a sanitizer runtime, whose initialisers run in the host process at load",
    "-static-libstdc++": "links libstdc++'s initialisers into the kernel: they would run at load",
    "-static": "links a second C library into the host process",
    "-nostdlib": "drops the toolchain's startfiles, so that a tenant's _init would run at load",
    "-nostartfiles": "drops the toolchain's startfiles, so that a tenant's _init would run at load",
    "-nodefaultlibs": "drops the toolchain's own libraries",
    "-nolibc": "drops the toolchain's own libraries",
    "-l": "names a library off the toolchain's list (its initialisers would run in the host process)",
    # what safejit decides itself
    "-flto": "assembles at link time, where what is read cannot be tracked",
    "-x": "changes the language",
    "-E": "changes the output kind",
    "-S": "changes the output kind",
    "-c": "changes the output kind",
    "-fsyntax-only": "changes the output kind",
    "--cubin": "changes the output kind",
    "--ptx": "changes the output kind",
    "-ptx": "changes the output kind",
    "--fatbin": "changes the output kind",
    "--device-c": "makes relocatable device code, which cannot be loaded as it is",
    "-dc": "makes relocatable device code, which cannot be loaded as it is",
    "-rdc": "makes relocatable device code, which cannot be loaded as it is",
    "--relocatable-device-code": "makes relocatable device code, which cannot be loaded as it is",
    "-ewp": "makes relocatable device code, which cannot be loaded as it is",
    "--extensible-whole-program": "makes relocatable device code, which cannot be loaded as it is",
    "-dlto": "makes LTO IR, not a cubin",
    "--dlink-time-opt": "makes LTO IR, not a cubin",
    "-arch": "is chosen by safejit: pass arch= to compile()",
    "--gpu-architecture": "is chosen by safejit: pass arch= to compile()",
    "-code": "is chosen by safejit: pass arch= to compile()",
    "--gpu-code": "is chosen by safejit: pass arch= to compile()",
    "-gencode": "is chosen by safejit: pass arch= to compile()",
    "--generate-code": "is chosen by safejit: pass arch= to compile()",
    "--cce-aicore-arch": "is chosen by safejit: pass arch= to compile()",
    "--npu-arch": "is chosen by safejit: pass arch= to compile()",
    "--split-compile": "starts compiler threads beyond one compile's share",
    "-split-compile": "starts compiler threads beyond one compile's share",
    "--modify-stack-limit": "changes this process's stack limit (only =false is taken)",
    # printing instead of compiling
    "-###": "prints commands instead of compiling",
    "--dryrun": "prints commands instead of compiling",
    "-dryrun": "prints commands instead of compiling",
    "-v": "prints the toolchain's paths and commands",
    "--verbose": "prints the toolchain's paths and commands",
    "-print-": "prints instead of compiling",
    "--print-": "prints instead of compiling",
    "--help": "prints instead of compiling",
    "--version": "prints instead of compiling",
}

#: Why ``-Wl,`` options known to be dangerous are refused.
LINKER_REASONS: Final = {
    "-rpath": "sets a library search path the loader follows at load, from anywhere",
    "--rpath": "sets a library search path the loader follows at load, from anywhere",
    "-R": "sets a library search path the loader follows at load, from anywhere",
    "-rpath-link": "reads libraries from a tenant-chosen dir",
    "--rpath-link": "reads libraries from a tenant-chosen dir",
    "-soname": "names the library: a later dlopen of that name in the host process would get it",
    "--soname": "names the library: a later dlopen of that name in the host process would get it",
    "-h": "names the library: a later dlopen of that name in the host process would get it",
    "execstack": "makes the host process's stack executable at load",
    "--no-as-needed": "makes every -l library a load-time dependency, whose initialisers run at load",
    "-init": "runs a tenant function in the host process at load",
    "-fini": "runs a tenant function in the host process at unload",
    "interpose": "lets the library interpose on the host process's symbols",
    "initfirst": "runs the library's initialisers before the host process's own",
    "global": "makes the library's symbols global in the host process",
    "--whole-archive": "pulls whole archives (and their initialisers) into the artifact",
    "--push-state": "changes how later libraries are linked",
    "-l": "names a library: use -l<name> from the toolchain's list",
    "-L": "adds library dirs whose contents are not tracked",
    "-o": "redirects output",
    "-T": "reads a linker script",
    "--script": "reads a linker script",
    "--version-script": "reads a file",
    "--dynamic-list": "reads a file",
    "-Map": "writes a file",
    "--dependency-file": "writes a file (safejit passes its own)",
    "-plugin": "loads a plugin into the linker",
    "--plugin": "loads a plugin into the linker",
    "--wrap": "redirects symbols",
    "--defsym": "defines symbols",
    "@": "reads a response file",
}
