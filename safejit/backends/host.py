"""Host backend: C/C++ through the system compiler into a shared object,
loaded from the verified bytes (memfd + dlopen: ``_host_library.py``) and called
through ctypes.

Calling a kernel runs the tenant's code in this process; loading one must not:
an object that would run code of its own at ``dlopen`` (beyond what the
toolchain's own empty link runs, read by the probe) is refused with
``LoadTimeCodeError`` before it is published or loaded (``_load_time.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import faults
from ..closure.anchors import real_path
from ..closure.depfiles import parse_listing
from ..closure.hashing import hash_file, read_output
from ..errors import ConfigError, LoadError, LoadTimeCodeError, SafejitError
from ..sandbox import SYSTEM_PATH
from ..spec import BuildSpec, LoadBaseline, Source, Toolchain
from ._argv import PCH_GUARD, preprocessor_apart, run_argv
from ._elf import ElfError, dynsym_functions
from ._host_library import HostLibrary
from ._load_time import baseline_of, load_time_code
from ._native import resolve_native
from ._signatures import host_products, is_clang, no_caret_flags, signature_flags
from ._toolchain import (
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
from ._toolreads import ASM_DEP_FLAG, LD_DEP_FLAG
from .base import CompileContext, CompileEvents, CompileOutput, Products, Runner, macro_flags

__all__ = ["HostBackend", "HostLibrary", "elf_exported_functions", "refuse_load_time_code"]

logger = logging.getLogger(__name__)

#: 9: a probe records the include dirs the compiler skipped, not there (it stands while they are absent);
#: 10: and carries them on the Toolchain (a compile's lookups of them are the compiler's own).
_PROBE_SCHEMA: Final = 10


def _assembler_flags(version: str) -> tuple[str, ...]:
    """What has the compiler that says ``version`` of itself assemble with GNU as, whose
    ``--MD`` lists the files inline asm reads: clang's integrated assembler lists none."""
    return ("-fno-integrated-as",) if is_clang(version) else ()


class HostBackend:
    name = "host"
    artifact_ext = "so"
    abi = 2  # 2: artifacts carry their kernels' prototypes (DWARF), the manifest their signatures
    flag_family = "gcc"
    needs_workdir = True

    def __init__(
        self, *, cc: str | None = None, cxx: str | None = None, state_dir: str | None = None, **_: Any
    ) -> None:
        self._compilers = {"c": cc, "c++": cxx}
        self._probes = ProbeCache(state_dir)
        self._probed = ProbeMemo()
        self._lock = threading.Lock()
        #: What machine-dependent flags mean here, per (compiler, language, flags): once
        #: per process, never on disk (a per-user state dir may be shared between nodes).
        self._native: dict[tuple[str, str, tuple[str, ...]], tuple[str, ...]] = {}

    # -- toolchain -----------------------------------------------------------
    def language(self, source: Source) -> str:
        return "c++" if source.is_cxx() else "c"

    def compiler_path(self, language: str) -> str:
        given = self._compilers[language]
        field = "host_cxx" if language == "c++" else "host_cc"
        setting = f"Config.{field} (SAFEJIT_{field.upper()})"
        found = given or shutil.which("c++" if language == "c++" else "cc", path=SYSTEM_PATH)
        if not found:
            raise ConfigError(
                f"no {language} compiler found on the fixed PATH {SYSTEM_PATH} (the caller's PATH is not "
                f"searched); set {setting} to its absolute path"
            )
        if not os.path.isabs(found):
            raise ConfigError(f"{setting} must be an absolute path, got {found!r}")
        real = real_path(found)  # (through the kernel: one lstat per component is ~40 us more)
        if given and not (os.path.isfile(real) and os.access(real, os.X_OK)):
            raise ConfigError(f"{setting} is {given!r}, which is no executable file")
        return real

    def toolchain(self, source: Source, run: Runner) -> Toolchain:
        language = self.language(source)
        return self._probed.get(language, lambda: self._probe(language, run))

    def toolchain_unchanged(self, spec: BuildSpec, since: float) -> bool:
        try:
            same = self._probes.unchanged(self._ident(spec.language), spec.toolchain, since)
        except (OSError, ConfigError):
            same = False
        if not same:
            self._probed.forget(spec.language)
        return same

    def _ident(self, language: str) -> list[Any]:
        """What the probe of ``language``'s compiler is keyed by: the driver's stat now."""
        return [*file_ident(self.compiler_path(language)), _PROBE_SCHEMA, language]

    def _probe(self, language: str, run: Runner) -> Toolchain:
        compiler = self.compiler_path(language)
        ident = [*file_ident(compiler), _PROBE_SCHEMA, language]
        cached = self._probes.get(ident)
        if cached is not None:
            return cached
        # A compiler outside /usr must be readable to probe it: first the driver's own dir
        # (what runs nothing else), then where it finds its programs and files.
        where = [os.path.dirname(compiler)]
        version = run_text(run, [compiler, "--version"], where).strip()
        digests = [hash_file(compiler)[0]]
        # The programs the driver runs are part of the toolchain: their digests enter the
        # key, and the probe is redone when one of them changes.
        found = []
        search_out = run_text(run, [compiler, "-print-search-dirs"], where)
        programs = program_dirs(search_out)
        dirs = dir_idents(programs)
        for prog in ("cc1plus" if language == "c++" else "cc1", "as", "ld"):
            name = run_text(run, [compiler, f"-print-prog-name={prog}"], where).strip()
            path = find_program(name)
            if path is not None:
                found.append((name, path))
        # (an install under /opt, spack's, conda's: cc1, its binutils and the compiler's own
        # headers lie outside the driver's dir and outside the system roots; a compile runs
        # what the probe ran)
        ran = list(dict.fromkeys(os.path.dirname(path) for _, path in found))
        where += [d for d in (*programs, *install_dir(search_out), *ran) if os.path.isdir(d)]
        verbose = run_text(run, [compiler, "-E", "-v", "-x", language, "/dev/null", "-o", "/dev/null"], where)
        search = compiler_search_dirs(verbose)
        skipped = absent_search_dirs(verbose)
        dirs += skipped
        roots = [*search, *ran, os.path.dirname(compiler)]
        # Inline asm can read files (.incbin, .include) that no depfile of the compiler
        # names; GNU as writes its own (--MD). Without it such reads go unseen. (clang's
        # own assembler lists nothing: clang is made to run GNU as, as gcc does.)
        probe = [compiler, "-c", "-x", language, *_assembler_flags(version), "/dev/null", "-o", "/dev/null"]
        probe.append("-Wa,--MD,/dev/null")
        asm_deps = run(probe, cwd="", timeout=60, extra_read=where).returncode == 0
        if not asm_deps:
            logger.warning(
                "the assembler of %s cannot list the files it reads (GNU as --MD): files that "
                "inline asm reads (.incbin, .include) are not part of the dependency closure",
                compiler,
            )
        # Where the linker finds libraries (-l; -L is refused): roots for what it reads
        # only, never for includes or sources. What it reads to link nothing (crt files,
        # libc, libgcc) is the toolchain's own: in its digest, like cc1.
        link_roots = [os.path.realpath(d) for d in program_dirs(search_out, "libraries") if os.path.isdir(d)]
        link_deps, link_inputs, baseline = self._probe_link(compiler, language, run, (*where, *link_roots))
        link_roots += [os.path.dirname(real) for _, real in link_inputs]
        more, tools = hash_tools([*found, *link_inputs])
        digests += more
        tc = Toolchain(
            compiler=compiler,
            version=version,
            digest=":".join(digests),
            roots=tuple(dict.fromkeys(roots)),
            search_dirs=tuple(search),
            asm_deps=asm_deps,
            link_deps=link_deps,
            link_inputs=tuple(name for name, _ in link_inputs),
            link_roots=tuple(dict.fromkeys(link_roots)),
            load_baseline=baseline,
            spelled_dirs=tuple(spelled_search_dirs(verbose)),
        )
        self._probes.put(ident, tc, tools, dirs)
        return tc

    @staticmethod
    def _probe_link(
        compiler: str, language: str, run: Runner, where: Sequence[str]
    ) -> tuple[bool, list[tuple[str, str]], LoadBaseline | None]:
        """Link an empty shared object as a kernel is linked, and learn from it: whether
        the linker lists the files it reads (GNU ld, lld: ``--dependency-file``): crt
        files, libraries, linker scripts, which no depfile of the compiler names;
        ``(name, resolved)`` of those it reads to link nothing: the toolchain's own; and
        what the toolchain's own shared object runs at load (its crt files' ``_init``,
        ``frame_dummy``…), which a kernel may hold and nothing more. None: no baseline
        (every kernel is then refused)."""
        with tempfile.TemporaryDirectory(prefix="safejit-link-probe-") as scratch:
            empty = os.path.join(scratch, "empty.so")
            link = [compiler, "-shared", "-fPIC", "-O2", "-fno-lto", "-x", language, "/dev/null", "-o", empty]
            listing = "-Wl,--dependency-file=/dev/stdout"
            result = run([*link, listing], cwd=scratch, timeout=60, extra_read=where)
            try:
                listed = parse_listing(result.log) if result.returncode == 0 else None
            except ValueError:
                listed = None
            if listed is None:
                logger.warning(
                    "the linker of %s cannot list the files it reads (--dependency-file): libraries and "
                    "crt files are not part of the dependency closure",
                    compiler,
                )
                result = run(link, cwd=scratch, timeout=60, extra_read=where)
            baseline = _baseline(compiler, empty) if result.returncode == 0 else None
        if listed is None:
            return False, [], baseline
        # (the driver's temporary object is gone by now; whatever else is not a file is no input)
        inputs = [(p, os.path.realpath(p)) for p in listed if os.path.isabs(p) and os.path.isfile(p)]
        return True, inputs, baseline

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
        if arch is not None:
            raise ConfigError("the host backend takes no arch; pass -march=… in flags")
        # Libraries after the source: the linker takes from an archive only what the
        # objects before it need. -fno-lto (last: it wins): an object that claims to hold
        # LTO bytecode (top-level asm can forge those sections) is linked as it is, never
        # compiled and assembled again at link time, where what is read goes unlisted.
        libs = [f for f in flags if f.startswith("-l")]
        argv = [
            toolchain.compiler,
            "-shared",
            "-fPIC",
            "-O2",
            "-include",
            PCH_GUARD,  # (first: no precompiled header can stand in for a header unrecorded)
            *(f for f in flags if not f.startswith("-l")),
            *signature_flags(toolchain),  # (after the user's: what each kernel takes, in DWARF)
            *no_caret_flags(toolchain.version),
            "-fno-lto",
            *preprocessor_apart(toolchain.version),
        ]
        if language == "c++" and not is_clang(toolchain.version):
            # g++ makes the statics of inline functions and templates STB_GNU_UNIQUE, which
            # the loader binds for the whole process to the first library defining them: a
            # rebuilt kernel ran an earlier build's (refused at load_time_code otherwise).
            argv.append("-fno-gnu-unique")
        argv += macro_flags(defines)
        argv += [f"-I{d}" for d in include_dirs]
        if quote_dir is not None:
            argv += ["-iquote", quote_dir]
        if toolchain.asm_deps:
            argv += [*_assembler_flags(toolchain.version), ASM_DEP_FLAG]
        if toolchain.link_deps:
            argv.append(LD_DEP_FLAG)
        argv += ["-MD", "-MF", "{DEP}", "-o", "{OUT}", "-x", language, "{SRC}", *libs]
        return tuple(argv)

    def resolve_arch(self, arch: str | None) -> str | None:
        if arch is not None:
            raise ConfigError("the host backend takes no arch; pass -march=... in flags")
        return None

    def resolve_machine_flags(
        self, flags: tuple[str, ...], *, toolchain: Toolchain, language: str, run: Runner
    ) -> tuple[str, ...]:
        key = (toolchain.compiler, language, flags)
        found = self._native.get(key)
        if found is None:
            where = (os.path.dirname(toolchain.compiler),)
            found = self._native[key] = resolve_native(run, toolchain.compiler, language, flags, where)
        return found

    def close(self) -> None:
        pass

    def compile(self, ctx: CompileContext) -> CompileOutput:
        if ctx.events is not None:  # (the refusal's look at the artifact, taken while the driver exits)
            ctx = dataclasses.replace(ctx, events=_CheckedAtClose(ctx.events, ctx.spec))
        b = run_argv(ctx, ext=self.artifact_ext)
        refuse_load_time_code(ctx.spec, b.artifact)
        kernels, meta = self.products(b.artifact)
        return CompileOutput(
            b.artifact, b.deps, kernels, b.log, b.argv, b.seconds, b.complete, meta, tool_reads=b.tool_reads
        )

    # -- artifacts -----------------------------------------------------------
    def products(self, artifact: bytes) -> Products:
        """The exported functions and ``{"signatures": ...}``: their prototypes, from
        the artifact's debug info (``_signatures.py``)."""
        return host_products(artifact)

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> HostLibrary:
        faults.point("load")
        signatures = (options or {}).get("signatures") or {}
        return HostLibrary(artifact, name, signatures)


def _baseline(compiler: str, path: str) -> LoadBaseline | None:
    try:
        return baseline_of(read_output(path))
    except (OSError, ElfError) as exc:
        logger.warning("the empty shared object %s links cannot be read (%s): every kernel is refused", compiler, exc)
        return None


class _CheckedAtClose:
    """``events``, with the artifact's load-time check made at its close (the same check
    after the compile then finds it made, for the very same bytes)."""

    def __init__(self, events: CompileEvents, spec: BuildSpec) -> None:
        self._events = events
        self._spec = spec

    def started(self) -> None:
        self._events.started()

    def listed(self, deps: tuple[str, ...], complete: bool) -> None:
        self._events.listed(deps, complete)

    def closed_artifact(self, data: bytes, tool_reads: Mapping[str, tuple[str, ...]] | None) -> None:
        with contextlib.suppress(SafejitError):  # (refused: the check after the compile says so)
            refuse_load_time_code(self._spec, data)
        self._events.closed_artifact(data, tool_reads)

    def looked(self, data: bytes) -> None:
        self._events.looked(data)


#: The bytes last found free of load-time code, with the baseline they were held to.
_passed: tuple[bytes, LoadBaseline] | None = None


def refuse_load_time_code(spec: BuildSpec, artifact: bytes) -> None:
    """Raise :class:`LoadTimeCodeError` if loading ``artifact`` would run code of its own
    (or change the process for it) beyond what the toolchain's empty link does."""
    global _passed
    baseline = spec.toolchain.load_baseline
    passed = _passed
    if passed is not None and baseline is not None and passed[1] is baseline and passed[0] == artifact:
        return
    if baseline is None:
        reasons = ["the toolchain's own empty shared object could not be made or read, so nothing may be loaded"]
    else:
        try:
            reasons = load_time_code(artifact, baseline)
        except ElfError as exc:
            raise LoadError(f"{spec.name}: not a readable shared object: {exc}", name=spec.name) from exc
    if reasons:
        raise LoadTimeCodeError(
            f"{spec.name}: refused: loading it would run code of its own or change the process for it: "
            + "; ".join(reasons),
            name=spec.name,
            reasons=tuple(reasons),
        )
    if baseline is not None:  # (always, having passed)
        _passed = (artifact, baseline)


def elf_exported_functions(artifact: bytes) -> tuple[str, ...]:
    """Defined global/weak functions in an ELF shared object's ``.dynsym``
    (``_elf.dynsym_functions``: it runs on every compile, where a general ELF
    library costs milliseconds)."""
    try:
        return dynsym_functions(artifact)
    except ElfError as exc:
        raise LoadError(f"artifact is not a readable ELF shared object: {exc}") from exc
