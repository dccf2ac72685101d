"""Running a compiler argv from a spec: stage the source, fill the slots, run each
step (steps are separated by ``--``), then read the artifact and the depfile (what the
assembler and the linker read: ``_toolreads.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ..closure.anchors import LOOKED_OUTSIDE, climbs_out, first_outside
from ..closure.depfiles import check_compiler_depfile, parse_depfile
from ..closure.hashing import read_output
from ..errors import CompileError, FlagPolicyError, LimitExceededError, UndeclaredDependencyError
from ..sandbox import lookups
from ..spec import BuildSpec
from ._compilerlog import (
    AS_UNREAD,
    display_paths,
    in_user_terms,
    searched_note,
    source_path,
    unread_alike,
    unread_names,
    user_paths,
)
from ._toolreads import read_lists, tool_reads
from .base import CompileContext

__all__ = [
    "DEBUG_MAP",
    "DEFINES_HEADER",
    "DEFINES_SLOT",
    "PCH_GUARD",
    "ArgvBuild",
    "preprocessor_apart",
    "run_argv",
]

logger = logging.getLogger(__name__)

#: A header of macro definitions that a backend writes into the work dir (nvcc: the
#: definitions its shell must never see), named in argv by :data:`DEFINES_SLOT`. Its
#: bytes are a function of the spec (its flags and defines), so the key covers them;
#: it is the compiler's input like the staged source, never part of the closure.
DEFINES_HEADER = ".defines.h"
DEFINES_SLOT = "{DEFINES}"


@dataclass(frozen=True, slots=True)
class ArgvBuild:
    artifact: bytes
    #: Absolute paths the depfile named, the staged source excluded. Joined, never
    #: normpath'd: "sub/.." after a symlinked dir is not "." (completeness resolves it).
    deps: tuple[str, ...]
    #: False when the depfile does not even name the source: the closure is unknown.
    complete: bool
    #: What the assembler and the linker read beyond ``deps`` (see :func:`tool_reads`).
    tool_reads: dict[str, tuple[str, ...]]
    log: str
    argv: tuple[str, ...]
    seconds: float


#: An empty file a prepared work dir holds for the source (cache.staging): renaming it
#: into place costs ~20 µs, creating a file up to a millisecond.
_SOURCE_BLANK = ".source"


def _write_source(path: str, code: bytes) -> None:
    blank = os.path.join(os.path.dirname(path), _SOURCE_BLANK)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.rename(blank, path)
    except OSError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        flags |= os.O_CREAT  # (or there already: a second compile in the same work dir)
    fd = os.open(path, flags | os.O_TRUNC, 0o600)
    try:
        view = memoryview(code)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    """A regular file of the work dir (a symlink or a FIFO a compile left there is an
    error: ``OSError``), holding ``data``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


#: The argv slot of :data:`PCH_GUARD_TEXT`'s file, which gcc-family argv force-include first.
PCH_GUARD: Final = "{GUARD}"
#: A C token before anything else in the translation unit: gcc uses a precompiled
#: header (``x.h.gch`` beside ``x.h``) only before the first token, and its depfile then
#: names neither the header nor the ``.gch`` — what the compiler read would go
#: unrecorded. After this, no ``.gch`` is even looked for. (An identifier reserved to
#: the implementation: no kernel can clash with it.)
PCH_GUARD_TEXT: Final = b"extern int __safejit_no_precompiled_headers;\n"


#: The argv slot of ``-fdebug-prefix-map=<work dir>=.``: debug info names the staged
#: source ``./src/<file>``, so the same inputs make the same bytes in any work dir.
DEBUG_MAP: Final = "{DEBUG_MAP}"


def preprocessor_apart(version: str) -> tuple[str, ...]:
    """What has the compiler that says ``version`` of itself preprocess in a program of
    its own, where the lookup recorder runs (``sandbox/lookups.c``): clang 10 and later
    may do it in the driver's process, which must go on to run programs (the recorder
    refuses exec). They run it apart already when they link too, as every host build
    does: this makes it so whatever a driver would choose (bisheng, a clang, compiles
    only). GCC's cc1 and older clangs always run apart."""
    at = version.find("clang version ")  # (no regex: argv is made on every hit's path)
    rest = version[at + len("clang version ") :] if at >= 0 else ""
    major = rest[: len(rest) - len(rest.lstrip("0123456789"))]  # (its leading digits)
    return ("-fno-integrated-cc1",) if major and int(major) >= 10 else ()


def _guard_path(workdir: str) -> str:
    return os.path.join(workdir, "src", ".no-pch.h")


def depfile_path(workdir: str, spec: BuildSpec) -> str:
    """Where ``run_argv`` has the compiler write ``spec``'s depfile."""
    return os.path.join(workdir, f"{spec.name}.d")


def artifact_path(workdir: str, spec: BuildSpec, ext: str) -> str:
    """Where ``run_argv`` has the compiler write ``spec``'s artifact (``ext``: ``so``, ...)."""
    return os.path.join(workdir, f"{spec.name}.{ext}")


def depfile_deps(dep: str, spec: BuildSpec, data: bytes | None = None) -> tuple[tuple[str, ...], bool]:
    """The paths the depfile ``dep`` of ``spec``'s build names (its bytes ``data``, else
    read now), absolute, the staged source excluded; and whether it names that source
    (else the closure is unknown). Raises ``OSError`` when it cannot be read."""
    workdir = os.path.dirname(dep)
    src = source_path(workdir, spec)
    guard = _guard_path(workdir)
    if data is None:
        data = read_output(dep)
    text = data.decode("utf-8", "surrogateescape")
    try:
        check_compiler_depfile(text, lambda name: os.path.lexists(os.path.join(workdir, name)))
    except ValueError as exc:
        raise UndeclaredDependencyError(
            f"{spec.name}: the compiler's list of the files it read cannot be read one way only ({exc}); "
            "a file name holding a backslash or a control character cannot be a dependency"
        ) from None
    reported = parse_depfile(text)
    absolute = [p if os.path.isabs(p) else os.path.join(workdir, p) for p in reported]
    own = (src, guard, os.path.join(workdir, DEFINES_HEADER))
    return tuple(p for p in absolute if p not in own), src in absolute


def run_argv(
    ctx: CompileContext,
    *,
    ext: str,
    defines_header: bytes | None = None,
    check: Callable[[Sequence[str], Sequence[str]], None] | None = None,
) -> ArgvBuild:
    """Run ``ctx.spec``'s argv in ``ctx.workdir``: stage the source, fill the slots, run
    each step (steps are separated by ``--``), then read the artifact, the depfile and
    the other tools' lists. While the last step runs, its closes are reported to
    ``ctx.events`` (``listed`` at the depfile's, ``closed_artifact`` at the artifact's).
    ``defines_header``: the bytes of :data:`DEFINES_HEADER`, which ``spec.argv`` names
    as :data:`DEFINES_SLOT`; ``check(templates, argv)``: the backend's last word on the
    argv once the roots are put in (it raises to refuse it), before anything runs."""
    slots = _slots(ctx.workdir, ctx.spec, ext)
    argv = _filled(ctx, slots, check)
    _stage(ctx.spec, slots, argv, defines_header)
    watcher = _Closes(ctx, slots["{DEP}"], slots["{OUT}"])
    files, log, seconds = _run_steps(ctx, argv, slots, watcher)
    return _collected(ctx, argv, slots, files, log, seconds, watcher)


def _slots(workdir: str, spec: BuildSpec, ext: str) -> dict[str, str]:
    """What each slot of ``spec.argv`` stands for in ``workdir``."""
    dep = depfile_path(workdir, spec)
    return {
        "{SRC}": source_path(workdir, spec),
        "{OUT}": artifact_path(workdir, spec, ext),
        "{DEP}": dep,
        "{OBJ}": artifact_path(workdir, spec, "rel.o"),
        # {DEPNAME}: the depfile by its name in the work dir (the compiler's cwd), for an option
        # that a driver splits at commas (-Xcompiler), which the work dir's path may hold.
        "{DEPNAME}": os.path.basename(dep),
        DEFINES_SLOT: os.path.join(workdir, DEFINES_HEADER),
        PCH_GUARD: _guard_path(workdir),
        DEBUG_MAP: f"-fdebug-prefix-map={workdir}=.",
    }


def _filled(
    ctx: CompileContext, slots: Mapping[str, str], check: Callable[[Sequence[str], Sequence[str]], None] | None
) -> list[str]:
    """``ctx.spec.argv`` with its slots filled and its anchored tokens expanded, once
    refused where a root's path would change its meaning."""
    templates = ctx.spec.argv
    argv = [slots.get(a) or ctx.expand(a) for a in templates]
    for template, arg in zip(templates, argv, strict=True):
        if template.startswith("-Wl,") and arg.count(",") != template.count(","):
            # A root with a comma in its path would split a linker argument in two.
            raise FlagPolicyError(f"{arg!r}: a root's path holds a comma", flag=template, reason="linker")
    if check is not None:
        check(templates, argv)
    return argv


def _stage(spec: BuildSpec, slots: Mapping[str, str], argv: list[str], defines_header: bytes | None) -> None:
    """Write the source, and the guard and defines header where the argv names them."""
    if (DEFINES_SLOT in spec.argv) != (defines_header is not None):
        raise CompileError(f"{spec.name}: the argv and the defines header disagree", argv=argv)
    _write_source(slots["{SRC}"], spec.code)
    if PCH_GUARD in spec.argv:
        _write_file(slots[PCH_GUARD], PCH_GUARD_TEXT)
    if defines_header is not None:
        try:
            _write_file(slots[DEFINES_SLOT], defines_header)
        except OSError as exc:
            raise CompileError(f"{spec.name}: cannot write {DEFINES_HEADER}: {exc}", argv=argv) from exc


def _run_steps(
    ctx: CompileContext, argv: list[str], slots: Mapping[str, str], watcher: _Closes
) -> tuple[Mapping[str, bytes], str, float]:
    """Run each step of ``argv`` (separated by ``--``): the files the last one's runner
    read as they were closed, the steps' logs joined, and their seconds."""
    spec, workdir = ctx.spec, ctx.workdir
    dep, out = slots["{DEP}"], slots["{OUT}"]
    logs, seconds, start = [], 0.0, 0
    files: Mapping[str, bytes] = {}
    shown = display_paths(ctx)
    for end in [i for i, a in enumerate(argv) if a == "--"] + [len(argv)]:
        step = argv[start:end]
        start = end + 1
        # The runner reads the depfile and the artifact as the compiler closes them:
        # off the caller's time, and what stands is their content when the step ended.
        step_lists = read_lists(workdir, step)
        named = dep in step or slots["{DEPNAME}"] in step
        watch = [p for p in (dep, out) if p in step or (p == dep and named)] + step_lists + [watcher.records]
        watcher.lists = dict.fromkeys(step_lists)
        try:
            result = ctx.run(step, cwd=workdir, timeout=ctx.timeout, watch=watch, on_closed=watcher)
        except CompileError as exc:  # (a timeout: what the compiler said by then, in the user's names)
            raise in_user_terms(exc, shown) from exc
        files = result.files  # (only the last step's: a later step may rewrite a file)
        logs.append(result.log)
        seconds += result.seconds
        if result.returncode != 0:
            said = unread_alike(user_paths(result.log, shown))
            outside = first_outside(unread_names(said, ctx.search_dirs, spec.toolchain.search_dirs), ctx.read_roots)
            if outside is None:  # (an assembler's .incbin or .include that climbed out of a dir outside)
                names = [os.path.join(workdir, m.group(1) or m.group(2)) for m in AS_UNREAD.finditer(result.log)]
                ours = os.path.dirname(workdir)
                outside = next((n for n in names if "/.." in n and climbs_out(n, ctx.read_roots, ours=ours)), None)
            if outside is not None:  # (as the same lookup gives when nothing is there: see record_closure)
                logger.debug("%s: refused: the compiler could not open %r, outside every root", spec.name, outside)
                raise UndeclaredDependencyError(LOOKED_OUTSIDE)
            raise CompileError(
                f"{spec.name}: {os.path.basename(step[0])} exited with {result.returncode}\n{said}"
                + searched_note(said, ctx.search_dirs),
                log=said,
                argv=step,
                returncode=result.returncode,
            )
    return files, "\n".join(logs), seconds


def _collected(
    ctx: CompileContext, argv: list[str], slots: Mapping[str, str], files: Mapping[str, bytes], log: str,
    seconds: float, watcher: _Closes,
) -> ArgvBuild:  # fmt: skip
    """The build's artifact, depfile deps and other tools' reads (from ``files`` where
    the runner read them, else from the work dir; as ``watcher`` made them of the same
    bytes at their close, when it did); the intermediate object removed."""
    spec, workdir = ctx.spec, ctx.workdir
    out, obj = slots["{OUT}"], slots["{OBJ}"]
    limit = ctx.max_artifact_bytes
    try:
        artifact = files.get(out)
        if artifact is None:
            artifact = read_output(out, limit)
        elif limit is not None and len(artifact) > limit:
            raise LimitExceededError(f"artifact is {len(artifact)} bytes; the limit is {limit}", limit=limit)
        data = files.get(slots["{DEP}"])
        parsed = watcher.parsed
        if parsed is not None and data is not None and parsed[0] == data:
            deps, complete = parsed[1], parsed[2]
        else:
            deps, complete = depfile_deps(slots["{DEP}"], spec, data)
        lists = {p: files.get(p) for p in read_lists(workdir, argv)}
        for p in [p for p, data in lists.items() if data is None]:
            with contextlib.suppress(OSError):  # (written by an earlier step)
                lists[p] = read_output(p)
        if os.path.exists(obj):
            os.unlink(obj)  # intermediates are not kept
    except UndeclaredDependencyError:
        raise  # (a PermissionError, so an OSError too: not an output missing)
    except OSError as exc:
        raise CompileError(f"{spec.name}: compiler output missing: {exc}", log=log, argv=argv) from exc
    memo = watcher.reads
    if memo is not None and memo[0] == deps and memo[1] == lists:
        return ArgvBuild(artifact, deps, complete, memo[2], log, tuple(argv), seconds)
    try:
        reads = tool_reads(workdir, deps, lists, spec.toolchain.link_inputs)
    except ValueError as exc:
        raise CompileError(f"{spec.name}: {exc}; refusing the build", log=log, argv=argv) from None
    return ArgvBuild(artifact, deps, complete, reads, log, tuple(argv), seconds)


class _Closes:
    """Turns the files a running compile closes into ``ctx.events``: the depfile's
    close into ``listed``, the artifact's into ``closed_artifact`` (with what the
    other tools had listed as read by then, when all of them had)."""

    def __init__(self, ctx: CompileContext, depfile: str, artifact: str) -> None:
        self.ctx = ctx
        self.depfile = depfile
        self.artifact = artifact
        #: Where the programs that record their lookups write them (``sandbox.lookups``).
        self.records = os.path.join(ctx.workdir, lookups.PRELOAD_FILE)
        self.lists: dict[str, bytes | None] = {}
        self.deps: tuple[str, ...] | None = None
        #: What was made of the depfile's bytes, and of the lists at the artifact's close
        #: (``_collected`` takes them when the files it ends with are the same).
        self.parsed: tuple[bytes, tuple[str, ...], bool] | None = None
        self.reads: tuple[tuple[str, ...], dict[str, bytes | None], dict[str, tuple[str, ...]]] | None = None

    def __call__(self, path: str, data: bytes) -> None:
        events = self.ctx.events
        if events is None:
            return
        if path in self.lists:
            self.lists[path] = data
        elif path == self.records:
            events.looked(data)
        elif path == self.depfile:
            self.deps = self.parsed = None
            with contextlib.suppress(OSError, ValueError):
                deps, complete = depfile_deps(self.depfile, self.ctx.spec, data)
                self.deps, self.parsed = deps, (data, deps, complete)
                events.listed(deps, complete)
        elif path == self.artifact:
            reads = self.reads = None
            if self.deps is not None and None not in self.lists.values():
                with contextlib.suppress(ValueError):
                    workdir = os.path.dirname(self.artifact)
                    reads = tool_reads(workdir, self.deps, self.lists, self.ctx.spec.toolchain.link_inputs)
                    self.reads = (self.deps, dict(self.lists), reads)
            events.closed_artifact(data, reads)
