"""Ascend backend: bisheng → relocatable object → ld.lld → device binary.

Both tools run as sandboxed argv lists. Kernel names come from the ELF's
``.ascend.meta.<name>`` sections (``backends/_elf.py``), so ``Artifact.kernels``
is known without a device. Loading and launching go through CANN's runtime,
imported only when a kernel is loaded (``ascend_launch``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ...closure.hashing import hash_file
from ...errors import CompileError, ConfigError, FlagPolicyError, LoadError
from ...spec import BuildSpec, Source, Toolchain
from .._argv import PCH_GUARD, preprocessor_apart, run_argv
from .._elf import ElfError, section_names
from .._toolchain import (
    ProbeCache,
    ProbeMemo,
    absent_search_dirs,
    compiler_search_dirs,
    file_ident,
    run_text,
    spelled_search_dirs,
)
from ..base import CompileContext, CompileOutput, Products, Runner, macro_flags
from .launch import AscendLibrary

__all__ = ["AscendBackend", "ascend_kernel_names", "find_toolkit"]

_ARCH = re.compile(r"dav-(?:[a-z][0-9]{3,4}(?:-(?:vec|cube))?|[0-9]{4})\Z")
_TOOL_DIRS: Final = ("compiler/ccec_compiler/bin", "ccec_compiler/bin", "tools/ccec_compiler/bin", "bin")
#: 2: the skipped include dirs recorded (see the host backend's).
#: 3: and carried on the Toolchain (see the host backend's).
_PROBE_SCHEMA: Final = 3
_META: Final = ".ascend.meta."


def find_toolkit(homes: Sequence[str]) -> tuple[str, str, str]:
    """``(home, bisheng, ld.lld)`` from the first candidate home that has both tools."""
    for home in homes:
        for sub in _TOOL_DIRS:
            bisheng, lld = os.path.join(home, sub, "bisheng"), os.path.join(home, sub, "ld.lld")
            if os.access(bisheng, os.X_OK) and os.access(lld, os.X_OK):
                return os.path.realpath(home), os.path.realpath(bisheng), os.path.realpath(lld)
    raise ConfigError(
        f"no Ascend toolkit (bisheng and ld.lld) found under {homes}; set Config.ascend_home "
        "(SAFEJIT_ASCEND_HOME), or CANN's ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME"
    )


def ascend_kernel_names(binary: bytes) -> tuple[str, ...]:
    """Kernel names from ``.ascend.meta.<name>`` sections; mixed-kernel suffixes
    ``_mix_aic``/``_mix_aiv`` are stripped and duplicates merged."""
    try:
        names = {n[len(_META) :] for n in section_names(binary) if n.startswith(_META)}
    except ElfError as exc:
        raise LoadError(f"artifact is not a readable ELF object: {exc}") from exc
    return tuple(sorted({n.removesuffix("_mix_aic").removesuffix("_mix_aiv") for n in names if n}))


class AscendBackend:
    name = "ascend"
    artifact_ext = "o"
    abi = 1
    flag_family = "bisheng"
    needs_workdir = True

    def __init__(self, *, ascend_homes: Sequence[str] = (), state_dir: str | None = None, **_: Any) -> None:
        self._homes = tuple(ascend_homes)
        self._probes = ProbeCache(state_dir)
        self._toolchain = ProbeMemo()

    def language(self, source: Source) -> str:
        return "ascendc"

    def resolve_machine_flags(
        self, flags: tuple[str, ...], *, toolchain: Toolchain, language: str, run: Runner
    ) -> tuple[str, ...]:
        # (bisheng's table has no machine-dependent flag: the arch is arch=)
        raise FlagPolicyError(f"{flags[0]!r} cannot be resolved by the Ascend backend", flag=flags[0])

    def resolve_arch(self, arch: str | None) -> str:
        if arch is None:
            raise ConfigError("the Ascend backend needs arch= (e.g. 'dav-c220', 'dav-c220-vec', 'dav-2201')")
        if not _ARCH.match(arch):
            raise ConfigError(f"arch {arch!r} is not an Ascend architecture (e.g. 'dav-c220', 'dav-2201')")
        return arch

    def toolchain(self, source: Source, run: Runner) -> Toolchain:
        return self._toolchain.get("", lambda: self._probe(run))

    def toolchain_unchanged(self, spec: BuildSpec, since: float) -> bool:
        try:
            _, bisheng, lld = find_toolkit(self._homes)
            same = self._probes.unchanged(
                [*file_ident(bisheng), *file_ident(lld), _PROBE_SCHEMA], spec.toolchain, since
            )
        except (OSError, ConfigError):
            same = False
        if not same:
            self._toolchain.forget("")
        return same

    def _probe(self, run: Runner) -> Toolchain:
        home, bisheng, lld = find_toolkit(self._homes)
        ident = [*file_ident(bisheng), *file_ident(lld), _PROBE_SCHEMA]
        cached = self._probes.get(ident)
        if cached is None:
            version = run_text(run, [bisheng, "--version"], (home,)).strip()
            lld_version = run_text(run, [lld, "--version"], (home,)).strip()
            verbose = run_text(run, [bisheng, "-E", "-v", "-x", "c++", "/dev/null", "-o", "/dev/null"], (home,))
            system = compiler_search_dirs(verbose)
            skipped = absent_search_dirs(verbose)
            include = [
                p for p in (os.path.join(home, "include"), os.path.join(home, "compiler", "tikcpp")) if os.path.isdir(p)
            ]
            cached = Toolchain(
                compiler=bisheng,
                # (the linker's path on a line of its own: it may hold spaces)
                version=f"{version}\nld.lld: {lld}\n{lld_version}",
                digest=f"{hash_file(bisheng)[0]}:{hash_file(lld)[0]}",
                roots=tuple(dict.fromkeys((home, *system))),
                search_dirs=tuple(include),
                spelled_dirs=tuple(spelled_search_dirs(verbose)),
            )
            self._probes.put(ident, cached, dirs=skipped)
        return cached

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
        arch_flag = f"--npu-arch={arch}" if arch and arch[4:].isdigit() else f"--cce-aicore-arch={arch}"
        argv = [
            toolchain.compiler,
            "-c",
            "-O2",
            "-x",
            "cce",
            "--cce-aicore-only",
            arch_flag,
            *preprocessor_apart(toolchain.version),  # (where the lookup recorder runs)
            "-include",
            PCH_GUARD,  # (first: clang takes a .pch for the first -include's header)
            *flags,
            *macro_flags(defines),
            *(f"-I{d}" for d in include_dirs),
            *(f"-I{d}" for d in toolchain.search_dirs),
        ]
        if quote_dir is not None:
            argv += ["-iquote", quote_dir]
        argv += ["-MD", "-MF", "{DEP}", "-o", "{OBJ}", "{SRC}"]
        lld = toolchain.version.split("\nld.lld: ", 1)[1].split("\n", 1)[0]
        # One spec, two sandboxed steps: "--" separates the linker's argv.
        # --no-dependent-libraries: a source's ``#pragma comment(lib, "<path>")`` (its object's
        # .deplibs) would have the linker open any file and quote it in its errors.
        link = ("-m", "aicorelinux", "-Ttext=0", "--no-dependent-libraries")
        return (*argv, "--", lld, *link, "{OBJ}", "-o", "{OUT}")

    def compile(self, ctx: CompileContext) -> CompileOutput:
        spec = ctx.spec
        b = run_argv(ctx, ext=self.artifact_ext)
        kernels, meta = self.products(b.artifact)
        if not kernels:
            raise CompileError(
                f"{spec.name}: the binary has no .ascend.meta.<kernel> section, so no kernel (ACL cannot load it)",
                log=b.log,
            )
        return CompileOutput(
            b.artifact, b.deps, kernels, b.log, b.argv, b.seconds, b.complete, meta, tool_reads=b.tool_reads
        )

    def products(self, artifact: bytes) -> Products:
        kernels = ascend_kernel_names(artifact)
        return kernels, {}

    def load(self, artifact: bytes, *, name: str, options: Mapping[str, Any] | None = None) -> AscendLibrary:
        return AscendLibrary(artifact, name, ascend_kernel_names(artifact))

    def close(self) -> None:
        pass
