"""CUDA backend: NVRTC (in process, or in an isolated worker) or nvcc to a cubin.

Cubins are cached — never PTX, which an older driver may refuse. Compiling
needs no GPU; loading and launching do (see ``launch``). Past the style's ~450 lines:
the two compilers' probes, argv and closure rules are kept side by side, as each
mirrors the other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ...errors import CompileError, ConfigError, FlagPolicyError, LimitExceededError
from ...sandbox import SYSTEM_PATH
from ...sandbox import lookups as lookup_recorder
from ...sandbox.statedir import StateDir
from ...spec import BuildSpec, Source, Toolchain
from .._argv import run_argv
from .._compilerlog import source_as_known
from .._signatures import no_caret_flags
from .._toolchain import (
    ProbeCache,
    ProbeMemo,
    absent_search_dirs,
    compiler_search_dirs,
    dir_idents,
    file_ident,
    find_program,
    hash_tools,
    install_dir,
    program_dirs,
    run_text,
    spelled_search_dirs,
)
from ..base import CompileContext, CompileOutput, Products, Runner, macro_flags
from . import fastpath
from .cubin import KernelParams, cubin_frame_sizes, cubin_kernels
from .launch import CudaLibrary, device_arch
from .nvcc_shell import check_argv, defines_header, header_args, split_macros
from .nvrtc import NvrtcResult, NvrtcWorker, compile_with_headers, library_path, nvrtc_compile_once, nvrtc_failed
from .recorded import compile_recorded, recorded_options

try:  # imported with the backend (only when backend="cuda" is asked for), not on the compile path
    from cuda.bindings import nvrtc as _nvrtc
    from cuda.pathfinder import find_nvidia_header_directory
except ImportError:  # pragma: no cover - reported when the backend is used
    _nvrtc = None

__all__ = ["CudaBackend", "SpillWarning"]

logger = logging.getLogger(__name__)

_ARCH = re.compile(r"sm_[0-9]{2,3}[af]?\Z")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_FUNC = re.compile(r"Function properties for (\S+)")
#: 5: the host compiler's skipped include dirs recorded (see the host backend's).
#: 6: and carried on the Toolchain (see the host backend's).
_PROBE_SCHEMA: Final = 6
#: ``argv[0]`` of an NVRTC compile whose headers are handed over in memory (where its
#: lookups cannot be recorded): how NVRTC finds headers is part of the key.
NVRTC_IN_MEMORY: Final = "nvrtc-headers-in-memory"


#: Path flags nvcc takes only with their value as the next argument ("Unknown option
#: '-isystem/x'"); the policy's form, joined, stays the key's.
_SEPARATE: Final = ("-isystem", "-include")


def _separated(flags: Sequence[str]) -> list[str]:
    out: list[str] = []
    for flag in flags:
        prefix = next((p for p in _SEPARATE if flag.startswith(p) and len(flag) > len(p)), None)
        out += [flag] if prefix is None else [prefix, flag[len(prefix) :]]
    return out


class SpillWarning(UserWarning):
    """A kernel spills registers or uses local memory (``Config.cuda_spills="warn"``)."""


class CudaBackend:
    name = "cuda"
    artifact_ext = "cubin"
    abi = 1

    def __init__(
        self,
        *,
        compiler: str = "nvrtc",
        nvcc: str | None = None,
        state_dir: str | None = None,
        worker: bool = False,
        spills: str = "warn",
        require_landlock: bool = False,
        state: StateDir | None = None,
        **_: Any,
    ) -> None:
        if compiler not in ("nvrtc", "nvcc"):
            raise ConfigError(f"Config.cuda_compiler must be nvrtc or nvcc, got {compiler!r}")
        self.compiler = compiler
        self._nvcc = nvcc
        self._probes = ProbeCache(state_dir)
        self._worker_wanted = worker
        self._worker: NvrtcWorker | None = None
        self._spills = spills
        self._require_landlock = require_landlock
        self._state = state
        self._recorder: str | None = None
        self._recorder_known = False
        self._toolchains = ProbeMemo()
        self._nvrtc: Toolchain | None = None
        self._worker_toolchain: Toolchain | None = None
        self._worker_idents: tuple[tuple[int, int] | None, ...] = ()
        self._lock = threading.Lock()

    @property
    def flag_family(self) -> str:
        """NVRTC and nvcc take different options (``safejit.policy.flag_tables``)."""
        return self.compiler

    @property
    def needs_workdir(self) -> bool:
        """NVRTC compiles without the sandboxed runner (in process, or in its worker)."""
        return self.compiler != "nvrtc"

    # -- toolchain -----------------------------------------------------------
    def language(self, source: Source) -> str:
        return "cuda"

    def resolve_machine_flags(
        self, flags: tuple[str, ...], *, toolchain: Toolchain, language: str, run: Runner
    ) -> tuple[str, ...]:
        # (no flag of nvcc's or NVRTC's table depends on the machine: the arch is arch=)
        raise FlagPolicyError(f"{flags[0]!r} cannot be resolved by the CUDA backend", flag=flags[0])

    def resolve_arch(self, arch: str | None) -> str:
        if arch is None:
            found = device_arch()
            if found is None:
                raise ConfigError(
                    "no CUDA device is visible to pick an architecture from; "
                    "pass arch='sm_90' (or the target's) to compile()"
                )
            return found
        if not _ARCH.match(arch):
            raise ConfigError(f"arch {arch!r} is not an sm_XY architecture (e.g. 'sm_90', 'sm_90a')")
        return arch

    def toolchain(self, source: Source, run: Runner) -> Toolchain:
        if self.compiler == "nvrtc" and not self._worker_wanted:  # (loaded here once: it cannot change)
            with self._lock:
                if self._nvrtc is None:
                    if _nvrtc is not None:
                        _nvrtc.nvrtcVersion()  # (loaded now: the file probed is the one this process runs)
                    self._nvrtc = self._probe_nvrtc()
                return self._nvrtc
        if self.compiler == "nvrtc":  # (the worker loads the file anew: looked at as nvcc is)
            return self._toolchains.get("nvrtc", self._probe_nvrtc)
        return self._toolchains.get(self.compiler, lambda: self._probe_nvcc(run))

    def _include_dir(self) -> list[str]:
        """The toolkit's include dir (cuda_runtime_api.h, ...) and CCCL's (cuda/std/...), in
        nvcc's profile's order. CUDA 13 keeps CCCL in ``include/cccl``, named so by its
        users too (CUTLASS 4: ``<cccl/cuda/std/...>``): the dir above CCCL's is searched
        as well, even when the runtime's headers were found elsewhere (a pip wheel's)."""
        dirs = []
        for name in ("cudart", "cccl"):
            try:
                found = find_nvidia_header_directory(name)
            except Exception:
                found = None
            if found:
                real = os.path.realpath(found)
                if name == "cccl" and os.path.basename(real) == "cccl":
                    dirs.append(os.path.dirname(real))
                dirs.append(real)
        return list(dict.fromkeys(dirs))

    def records_lookups(self) -> bool:
        """Whether NVRTC compiles once with the real search path, its lookups recorded
        (the worker, with the lookup recorder built here); else headers are handed
        over in memory (see ``nvrtc``)."""
        if self.compiler != "nvrtc" or not self._worker_wanted:
            return False
        with self._lock:
            if not self._recorder_known:
                self._recorder = lookup_recorder.build(self._state, shutil.which("cc", path=SYSTEM_PATH))
                self._recorder_known = True
                if self._recorder is None:
                    logger.warning(
                        "NVRTC's lookups cannot be recorded here (no C compiler, or no seccomp); "
                        "headers are handed to it in memory, one compile per header it asks for"
                    )
            return self._recorder is not None

    def toolchain_unchanged(self, spec: BuildSpec, since: float) -> bool:
        if self.compiler == "nvrtc" and not self._worker_wanted:
            return True  # (the library this process loaded, probed once: it cannot change under it)
        try:
            if self.compiler == "nvrtc":
                ident = [*file_ident(library_path()), _PROBE_SCHEMA, "nvrtc"]
            else:
                ident = [*file_ident(self.nvcc_path()), *file_ident(self._host_cxx()), _PROBE_SCHEMA, "nvcc"]
            same = self._probes.unchanged(ident, spec.toolchain, since)
        except (OSError, ConfigError):
            same = False
        if not same:
            self._toolchains.forget(self.compiler)
        return same

    @staticmethod
    def _host_cxx() -> str:
        return os.path.realpath(shutil.which("g++", path=SYSTEM_PATH) or "/usr/bin/g++")

    def _probe_nvrtc(self) -> Toolchain:
        if _nvrtc is None:
            raise ConfigError("the CUDA backend needs cuda-python: pip install 'safejit[cuda]'")
        lib = library_path()  # (not loaded on a probe's hit)
        ident = [*file_ident(lib), _PROBE_SCHEMA, "nvrtc"]
        cached = self._probes.get(ident)
        if cached is not None:
            return cached
        _, major, minor = _nvrtc.nvrtcVersion()
        includes = self._include_dir()
        # NVRTC's built-in headers live in a library of their own, which it loads from
        # its own directory: every such file there is part of the toolchain.
        libdir = os.path.dirname(lib)
        dirs = dir_idents([libdir])
        with os.scandir(libdir) as it:
            builtins = sorted(e.path for e in it if e.name.startswith("libnvrtc-builtins.so") and e.is_file())
        digests, tools = hash_tools([(lib, lib), *((path, os.path.realpath(path)) for path in builtins)])
        tc = Toolchain(
            compiler=lib,
            version=f"nvrtc {major}.{minor}",
            digest=":".join(digests),
            roots=tuple(includes),
            search_dirs=tuple(includes),
            # (the wheels' common directory: another environment holding them shares keys)
            prefix=os.path.commonpath([os.path.dirname(lib), *includes]),
        )
        self._probes.put(ident, tc, tools, dirs)
        return tc

    def nvcc_path(self) -> str:
        found = self._nvcc or shutil.which("nvcc", path=f"/usr/local/cuda/bin:{SYSTEM_PATH}")
        if not found:
            raise ConfigError("nvcc not found; set Config.nvcc or install the CUDA toolkit")
        return os.path.realpath(found)

    def _probe_nvcc(self, run: Runner) -> Toolchain:
        nvcc = self.nvcc_path()
        host = self._host_cxx()
        ident = [*file_ident(nvcc), *file_ident(host), _PROBE_SCHEMA, "nvcc"]
        cached = self._probes.get(ident)
        if cached is not None:
            return cached
        prefix = os.path.dirname(os.path.dirname(nvcc))
        version = run_text(run, [nvcc, "--version"], (prefix,)).strip()  # (a toolkit outside /usr)
        # (a host compiler outside /usr, as the host backend probes one: its own dir, then
        # where it finds its programs and files)
        where = [os.path.dirname(host)]
        host_version = run_text(run, [host, "--version"], where).strip()
        cc1plus = run_text(run, [host, "-print-prog-name=cc1plus"], where).strip()
        search_out = run_text(run, [host, "-print-search-dirs"], where)
        cc1plus_real = find_program(cc1plus)
        where += [
            d
            for d in (*program_dirs(search_out), *install_dir(search_out), os.path.dirname(cc1plus_real or ""))
            if d and os.path.isdir(d)
        ]
        host_verbose = run_text(run, [host, "-E", "-v", "-x", "c++", "/dev/null", "-o", "/dev/null"], where)
        host_dirs = compiler_search_dirs(host_verbose)
        roots = [prefix, *self._include_dir(), *host_dirs]
        # What nvcc runs and reads for device code is part of the toolchain: its profile
        # (search paths, flags), cicc, ptxas and libdevice; and the host preprocessor
        # (cc1plus, which defines the macros device code sees). The probe is redone when
        # one of them changes, or when a file is added to the dirs nvcc finds them in.
        places = [os.path.join(prefix, d) for d in ("bin", "nvvm/bin", "nvvm/libdevice")]
        skipped = absent_search_dirs(host_verbose)
        dirs = dir_idents(places) + skipped
        kit = [os.path.join(prefix, f) for f in ("bin/nvcc.profile", "nvvm/bin/cicc", "bin/ptxas")]
        with contextlib.suppress(OSError), os.scandir(places[2]) as it:
            kit += sorted(e.path for e in it if e.name.endswith(".bc"))
        found = [(path, os.path.realpath(path)) for path in kit if os.path.isfile(path)]
        if cc1plus_real is not None:
            found.append((cc1plus, cc1plus_real))
            roots.append(os.path.dirname(cc1plus_real))
        digests, tools = hash_tools([(nvcc, nvcc), (host, host), *found])
        tc = Toolchain(
            compiler=nvcc,
            version=f"{version}\nhost: {host} {host_version}",
            digest=":".join(digests),
            roots=tuple(dict.fromkeys(roots)),
            search_dirs=(*self._include_dir(), *host_dirs),
            spelled_dirs=tuple(spelled_search_dirs(host_verbose)),
        )
        self._probes.put(ident, tc, tools, dirs)
        return tc

    # -- compile -------------------------------------------------------------
    def argv(
        self,
        *,
        toolchain: Toolchain,
        language: str,
        flags: Sequence[str],
        defines: Sequence[tuple[str, str | None]],
        include_dirs: Sequence[str],
        quote_dir: str | None,
        arch: str | None,
    ) -> tuple[str, ...]:
        if self.compiler == "nvrtc":
            # No -I here: the search path is the spec's (its include dirs enter the key through
            # the spec itself) and the toolchain's, given to NVRTC when it compiles (recorded)
            # or searched by safejit (headers in memory): how is part of the key.
            how = "nvrtc" if self.records_lookups() else NVRTC_IN_MEMORY
            macros = macro_flags(defines)
            return (how, f"--gpu-architecture={arch}", "-default-device", "--ptxas-options=-v", *flags, *macros)
        host_version = toolchain.version.split("\nhost: ", 1)[1]
        host = host_version.split(" ", 1)[0]
        # Macros whose text nvcc's shell could act on go into a header (nvcc_shell.py),
        # before the tenant's own -include files, as -D would be.
        others, _, _ = split_macros(flags, defines)
        defines_header(flags, defines)  # (refuses what a header cannot hold, before any key)
        argv = [
            toolchain.compiler,
            "--cubin",
            f"-arch={arch}",
            "-ccbin",
            host,
            "--ptxas-options=-v",
            *header_args(flags, defines),
            *_separated(others),
            # (after the user's: the host preprocessor quotes no line of a file a #line names)
            f"-Xcompiler={','.join(no_caret_flags(host_version))}",
            *(f"-I{d}" for d in include_dirs),
        ]
        if quote_dir is not None:
            # nvcc has no -iquote of its own: its host preprocessor, which reads the
            # includes, takes it (nvcc_shell.check_argv keeps its path plain).
            argv.append(f"-Xcompiler=-iquote,{quote_dir}")
        # The depfile is the device pass's preprocessor's own (-Xcompiler): nvcc's -MD would
        # preprocess the source a second time, as host code, only to list the same headers
        # (+9% CPU on a CuTe kernel). A cubin has no host pass: this lists all that was read.
        deps = ("-Xcompiler", "-MD", "-Xcompiler", "-MF", "-Xcompiler", "{DEPNAME}")
        return (*argv, *deps, "-o", "{OUT}", "-x", "cu", "{SRC}")

    def compile(self, ctx: CompileContext) -> CompileOutput:
        spec = ctx.spec
        if self.compiler == "nvrtc":
            ctx.started()  # (no process to wait for)
            if spec.argv[0] == NVRTC_IN_MEMORY:
                out = self._compile_in_memory(ctx)
            else:
                out = self._compile_recorded(ctx)
        else:
            if spec.name_expressions:  # (never a hit either: no such build is ever made)
                raise ConfigError(
                    "name_expressions are NVRTC's (template instantiations it names); with "
                    "cuda_compiler='nvcc', instantiate in the source (an extern \"C\" wrapper)"
                )
            out = self._compile_nvcc(ctx)
        self._check_spills(spec.name, out.log, out.artifact)
        return out

    def _compile_recorded(self, ctx: CompileContext) -> CompileOutput:
        spec = ctx.spec
        started = time.perf_counter()
        options = recorded_options(spec.argv[1:], ctx.search_dirs, ctx.expand)
        worker = self._worker_client(spec.arch, ctx.read_roots, spec.toolchain)
        result, reads = compile_recorded(
            spec.code,
            spec.name,
            options,
            list(spec.name_expressions),
            compile_once=worker.compile_once,
            timeout=ctx.timeout,
            max_deps=ctx.max_deps,
            confine=ctx.confine,
            roots=ctx.read_roots,
            max_cubin=ctx.max_artifact_bytes,
        )
        if not result.ok:
            raise nvrtc_failed(spec.name, result.log, options, ctx.search_dirs, source_as_known(ctx))
        _refuse_too_large(result, ctx)
        kernels = cubin_kernels(result.cubin)
        if reads.unknown:
            logger.warning("%s: NVRTC did what a closure cannot hold: %s", spec.name, reads.unknown[0])
        return CompileOutput(
            result.cubin,
            reads.deps,
            tuple(kernels),
            result.log,
            (spec.argv[0], *options),
            time.perf_counter() - started,
            not reads.unknown,
            meta=self._meta(kernels, result.lowered),
            absent=reads.absent,
            walls=worker.walls,
        )

    def _compile_in_memory(self, ctx: CompileContext) -> CompileOutput:
        spec, search_dirs = ctx.spec, ctx.search_dirs
        started = time.perf_counter()
        # Search-dir flags are searched by the resolver (they are in search_dirs); a flag that
        # would have NVRTC read a file itself (-include) cannot be honoured with no search path.
        options = [o for o in spec.argv[1:] if not o.startswith(("-I", "-isystem", "-iquote", "-idirafter"))]
        for option in options:
            if "\0" in option:
                raise FlagPolicyError(
                    f"{option.split(chr(0))[0]!r} needs NVRTC's lookups recorded (the worker, and a C compiler)",
                    flag=option.split("\0")[0],
                )
        worker = self._worker_client(spec.arch, (), spec.toolchain) if self._worker_wanted else None
        once = worker.compile_once if worker is not None else nvrtc_compile_once
        # (a computed #include is NVRTC's own reading of the filesystem: safe only where the
        # worker can read nothing, its hello says Landlock confines it, not wherever it runs)
        isolated = worker is not None and worker.confined()
        result, headers = compile_with_headers(
            spec.code,
            spec.name,
            options,
            list(spec.name_expressions),
            search_dirs=search_dirs,
            confine=ctx.confine,
            compile_once=once,
            isolated=isolated,
            timeout=ctx.timeout,
            max_headers=ctx.max_deps,
            roots=ctx.read_roots,
            max_cubin=ctx.max_artifact_bytes,
        )
        if not result.ok:
            raise nvrtc_failed(spec.name, result.log, options, search_dirs, source_as_known(ctx))
        _refuse_too_large(result, ctx)
        kernels = cubin_kernels(result.cubin)
        return CompileOutput(
            result.cubin,
            tuple(headers.values()),
            tuple(kernels),
            result.log,
            (spec.argv[0], *options),
            time.perf_counter() - started,
            True,
            meta=self._meta(kernels, result.lowered),
            walls=worker.walls if worker is not None else "in-process",
        )

    def _compile_nvcc(self, ctx: CompileContext) -> CompileOutput:
        spec = ctx.spec
        header = defines_header(spec.flags, spec.defines)
        b = run_argv(ctx, ext=self.artifact_ext, defines_header=header, check=check_argv)
        kernels, meta = self._products(b.artifact)
        return CompileOutput(
            b.artifact, b.deps, kernels, b.log, b.argv, b.seconds, b.complete, meta, tool_reads=b.tool_reads
        )

    def products(self, artifact: bytes) -> Products | None:
        # NVRTC's lowered names come from the compile, not from the cubin.
        return self._products(artifact) if self.compiler == "nvcc" else None

    def _products(self, cubin: bytes) -> Products:
        kernels = cubin_kernels(cubin)
        return tuple(kernels), self._meta(kernels, {})

    @staticmethod
    def _meta(kernels: KernelParams, lowered: Mapping[str, str]) -> dict[str, Any]:
        params = {k: [list(p) for p in v] for k, v in kernels.items()}
        return {"params": params, "symbols": dict(lowered)}

    def _check_spills(self, name: str, log: str, cubin: bytes) -> None:
        if self._spills == "ignore":
            return
        problems = [f"{fn}: {size} bytes stack frame" for fn, size in cubin_frame_sizes(cubin).items()]
        current = "?"
        for line in log.splitlines():
            func = _FUNC.search(line)
            if func:
                current = func.group(1)
            m = _SPILL.search(line)
            if m and any(int(x) for x in m.groups()[1:]):  # spills; the frame itself is read from the cubin
                problems.append(f"{current}: {m.group(0)}")
        if not problems:
            return
        text = f"{name}: register spills or local memory: " + "; ".join(problems)
        if self._spills == "error":
            raise CompileError(text, log=log)
        warnings.warn(text, SpillWarning, stacklevel=4)

    def _worker_client(self, arch: str | None, roots: Sequence[str], toolchain: Toolchain) -> NvrtcWorker:
        """The worker, started again when the roots it may read have changed — a source
        root's symlink re-pointed, or a root replaced at its path (a package reinstalled:
        Landlock holds the directory it was given, not its name) — or NVRTC has (the
        library it loaded is the one probed then); it records lookups when this backend does."""
        recorder = self._recorder if self.records_lookups() else None
        idents = tuple(_dir_ident(r) for r in roots)
        with self._lock:
            worker = old = self._worker
            if (
                worker is None
                or worker.roots != tuple(roots)
                or self._worker_idents != idents
                or self._worker_toolchain != toolchain
            ):
                worker = self._worker = NvrtcWorker(arch or "sm_90", self._require_landlock, roots, recorder)
                self._worker_toolchain, self._worker_idents = toolchain, idents
                if old is not None:
                    old.close()
            return worker

    # -- artifacts -----------------------------------------------------------
    def kernels(self, artifact: bytes) -> tuple[str, ...]:
        return tuple(cubin_kernels(artifact))

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> CudaLibrary:
        meta = dict(options or {})
        return CudaLibrary(artifact, name, meta.get("params", {}), meta.get("symbols", {}), self._fast_path)

    def _fast_path(self) -> Any:
        """The C launch path (built once per user and Python, in the private state dir), or None."""
        return fastpath.module(self._state, shutil.which("cc", path=SYSTEM_PATH))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def _dir_ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _refuse_too_large(result: NvrtcResult, ctx: CompileContext) -> None:
    """A cubin over ``max_artifact_bytes`` is refused by its size, as NVRTC gave it: never
    copied out of NVRTC, encoded or sent by the worker."""
    if result.too_large:
        limit = ctx.max_artifact_bytes
        raise LimitExceededError(f"artifact is {result.too_large} bytes; the limit is {limit}", limit=limit or 0)
