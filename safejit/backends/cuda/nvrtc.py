"""NVRTC with a complete dependency closure.

NVRTC writes no depfile. Two ways to know what it read:

- Recorded (the isolated worker, where the lookup recorder runs): NVRTC gets the
  real search path as ``-I`` and compiles once; the worker may read only under the
  declared roots (Landlock) and records every path NVRTC looks up, found or not
  (``safejit.sandbox.lookups``). The closure is what it found; the negative
  dependencies are what it looked for and did not find. See ``recorded``.
- Headers in memory (in process, or where the recorder cannot run): NVRTC gets no
  search path at all: every header it may read is handed to it in memory, found by
  our own resolver under the declared roots (and confined). When it names a header
  it does not have, the compile is retried with that header added. What was not
  handed over cannot be read — in the isolated worker because the worker has no
  filesystem access at all (Landlock); in process because every ``#include`` that
  could reach the filesystem directly (absolute, ``..``, computed) is resolved or
  refused first. The closure is therefore the set of headers handed over.

The compile, the hand-over and the worker's protocol stay in one module (hence its
length, past the style's ~450 lines): the worker runs exactly these requests, and the
in-memory hand-over is what both ways fall back to.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ...closure.anchors import Walk
from ...closure.hashing import read_beneath
from ...closure.scan import HAS_INCLUDE as _HAS_INCLUDE
from ...closure.scan import readings
from ...errors import CompileError, CompileTimeout, LimitExceededError, PathConfinementError, SandboxUnavailableError
from ...sandbox import SYSTEM_PATH
from ...sandbox._wait import LOG_HEAD, LOG_TAIL, readable
from ...sandbox.landlock import abi as landlock_abi

__all__ = [
    "NvrtcRequest",
    "NvrtcResult",
    "NvrtcWorker",
    "compile_with_headers",
    "library_path",
    "nvrtc_compile_once",
    "nvrtc_failed",
]

#: The name NVRTC is given for the main source: in a directory that does not
#: exist, so a relative include can never be found next to it on disk.
PROGRAM_DIR: Final = "/nonexistent-safejit-nvrtc"
#: NVRTC's words for a header it has not got: "cannot open" for a quoted include, "could
#: not open ... (no directories in search list)" for an angled one.
_MISSING = re.compile(r'^(.*?)\(\d+\): catastrophic error: (?:cannot|could not) open source file "([^"]+)"', re.M)
_INCLUDE = re.compile(
    rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]*)[>"]|^[ \t]*#[ \t]*include[ \t]*([^<"\s][^\n]*)', re.M
)
#: Every ``__has_include`` probe, whatever its operand.
_PROBE = re.compile(rb"__has_include(?:_next)?\s*\(")
_MAX_ROUNDS: Final = 4096


@dataclass
class NvrtcRequest:
    code: bytes
    name: str
    options: list[str]
    name_expressions: list[str]
    headers: dict[str, bytes] = field(default_factory=dict)
    #: Record every path NVRTC looks up (the worker's recorder).
    record: bool = False
    #: The largest cubin to hand back (``Config.max_artifact_bytes``): one larger is only
    #: said to be (``NvrtcResult.too_large``), never copied, encoded or sent.
    max_cubin: int | None = None


#: One recorded lookup: (kind, errno or 0, flags, absolute path); see ``sandbox.lookups``.
LookupRow = tuple[str, int, int, str]


@dataclass
class NvrtcResult:
    ok: bool
    log: str
    cubin: bytes = b""
    lowered: dict[str, str] = field(default_factory=dict)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (includer, header name)
    #: What NVRTC looked up, when the request asked for it (None: not recorded).
    lookups: list[LookupRow] | None = None
    #: The size of a cubin over the request's ``max_cubin`` (0: none was).
    too_large: int = 0


def nvrtc_compile_once(req: NvrtcRequest, timeout: float | None = None) -> NvrtcResult:
    """One NVRTC compile (in this process). Reports missing headers by name. (An
    NVRTC call cannot be interrupted: ``timeout`` is for the worker's, see NvrtcWorker.)"""
    from cuda.bindings import nvrtc

    def check(result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC call failed: {err}", log=str(err))
        return rest[0] if len(rest) == 1 else rest

    names = list(req.headers)
    prog = check(
        nvrtc.nvrtcCreateProgram(
            req.code,
            f"{PROGRAM_DIR}/{req.name}.cu".encode(),
            len(names),
            [req.headers[n] for n in names],
            [n.encode() for n in names],
        )
    )
    try:
        for expr in req.name_expressions:
            check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()))
        opts = [o.encode() for o in req.options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # NVRTC writes into the buffers it is given: bytearrays, never bytes (``b" " * 1`` is
        # the interpreter's one shared b" ", which an empty log's NUL overwrote for the process).
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        buf = bytearray(size)
        check(nvrtc.nvrtcGetProgramLog(prog, buf))
        log = bytes(buf).rstrip(b"\0").decode("utf-8", "replace")
        del buf
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            # (NVRTC stops at its first: more are the source's own text, which macros multiply)
            missing = list(dict.fromkeys((m.group(1), m.group(2)) for m in _MISSING.finditer(log)))[:_MISSING_MAX]
            return NvrtcResult(False, _capped(log), missing=missing)
        log = _capped(log)
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        if req.max_cubin is not None and size > req.max_cubin:
            return NvrtcResult(True, log, too_large=size)
        out = bytearray(size)
        check(nvrtc.nvrtcGetCUBIN(prog, out))
        cubin = bytes(out)
        lowered = {e: check(nvrtc.nvrtcGetLoweredName(prog, e.encode())).decode() for e in req.name_expressions}
        return NvrtcResult(True, log, cubin=cubin, lowered=lowered)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


#: The most headers a failed compile's log is read as missing (``NvrtcResult.missing``).
_MISSING_MAX: Final = 16


def _capped(log: str) -> str:
    """The head and tail of a compiler log, as a compiler process's (``OutputLog``): a
    template's warnings, one per instantiation, made hundreds of MB from a few lines."""
    if len(log) <= LOG_HEAD + LOG_TAIL:
        return log
    return f"{log[:LOG_HEAD]}\n[... {len(log) - LOG_HEAD - LOG_TAIL} characters cut ...]\n{log[-LOG_TAIL:]}"


def include_names(data: bytes) -> tuple[list[tuple[str, str]], bool]:
    """``(kind, name)`` of every literal ``#include`` and ``__has_include`` (kind ``"`` or
    ``<``), and whether a computed ``#include MACRO`` (or a ``__has_include`` of a name a
    macro makes) appears. Read as the preprocessor reads directives: a comment, a line
    splice or ``%:`` in one hides nothing."""
    found, computed = [], False
    # Read both as written and as the preprocessor reads it: a directive either reading
    # finds is handed over or refused (what one reading hides, the other may not).
    for text in dict.fromkeys((data, *readings(data, always=True))):
        probes = [(m[1].decode(), m[2].decode("utf-8", "replace").strip()) for m in _HAS_INCLUDE.finditer(text)]
        found += probes
        if b"__has_include" in text and len(probes) != len(_PROBE.findall(text)):
            computed = True  # (a probe of what a macro names, or one this scan cannot read)
        for m in _INCLUDE.finditer(text):
            if m.group(3) is not None:
                computed = True
            else:
                found.append((m.group(1).decode(), m.group(2).decode("utf-8", "replace").strip()))
    return list(dict.fromkeys(found)), computed


def compile_with_headers(
    code: bytes,
    name: str,
    options: list[str],
    name_expressions: list[str],
    *,
    search_dirs: Sequence[str],
    confine: Callable[[str], str],
    compile_once: Callable[[NvrtcRequest, float], NvrtcResult],
    isolated: bool,
    timeout: float,
    max_headers: int,
    roots: Sequence[str] = (),
    max_cubin: int | None = None,
) -> tuple[NvrtcResult, dict[str, str]]:
    """Compile, handing over headers until NVRTC stops asking.

    Returns the result and ``{header name: absolute path}`` of what was handed over.
    """
    deadline = time.monotonic() + timeout
    given = _HandedOver(name, search_dirs, confine, isolated, max_headers, Walk(roots) if roots else None)
    main = f"{PROGRAM_DIR}/{name}.cu"
    given.scan(code, None)
    for _ in range(_MAX_ROUNDS):
        left = deadline - time.monotonic()
        if left <= 0:
            raise CompileTimeout(f"NVRTC compile of {name} ran past {timeout:g}s", log="", timeout=timeout)
        request = NvrtcRequest(code, name, options, name_expressions, dict(given.headers), max_cubin=max_cubin)
        result = compile_once(request, left)
        if result.ok or not result.missing:
            return result, given.paths
        progressed = False
        for includer, header in result.missing:
            includer_file = None if includer == main else given.paths.get(includer)
            # (NVRTC adds "no directories in search list" to an angled include it has not got)
            kind = "<" if f'"{header}" (no directories in search list)' in result.log else '"'
            if header in given.paths:
                continue
            if _risky(header):  # (one a macro named, which no scan saw: refused one way, there or not)
                given.hand_over_risky(includer_file, kind, header)
            elif not given.hand_over(includer_file, kind, header):
                return result, given.paths  # genuinely missing: the compile error stands
            progressed = True
        if not progressed:
            return result, given.paths
    raise CompileError(f"NVRTC kept asking for headers after {_MAX_ROUNDS} rounds", log="")


class _HandedOver:
    """The headers handed to in-memory NVRTC so far: ``headers`` (name: bytes) and
    ``paths`` (name: the confined file each was read from)."""

    def __init__(
        self,
        name: str,
        search_dirs: Sequence[str],
        confine: Callable[[str], str],
        isolated: bool,
        max_headers: int,
        walk: Walk | None = None,
    ) -> None:
        self.name, self.search_dirs, self.confine = name, search_dirs, confine
        self.isolated, self.max_headers, self.walk = isolated, max_headers, walk
        self.headers: dict[str, bytes] = {}
        self.paths: dict[str, str] = {}

    def hand_over(self, includer_file: str | None, kind: str, header: str) -> bool:
        """Resolve, confine, read and scan ``header``; False when it resolves nowhere."""
        path = _resolve(header, kind, includer_file, self.search_dirs, self.confine, self.walk)
        if path is None:
            return False
        known = self.paths.get(header)
        if known is not None and known != path:
            raise CompileError(
                f"header name {header!r} resolves to two files ({known}, {path}); NVRTC "
                "can take only one file per name",
                log="",
            )
        if known is None:
            if len(self.paths) >= self.max_headers:
                raise LimitExceededError(
                    f"{self.name}: more than {self.max_headers} headers exceed the limit of dependencies",
                    limit=self.max_headers,
                )
            try:
                # The very file that was confined (a directory on the way swapped for a link
                # since is not followed), and no FIFO (which would block this process for good).
                found = read_beneath(path, lambda real: real == path)
            except OSError as exc:
                raise CompileError(f"cannot read header {path}: {exc}", log=str(exc)) from exc
            if found is None:
                raise PathConfinementError(f"header {header!r} changed while it was read; compile again", path=header)
            data = found[0]
            self.headers[header], self.paths[header] = data, path
            self.scan(data, path)
        return True

    def scan(self, data: bytes, file: str | None) -> None:
        names, computed = include_names(data)
        if computed and not self.isolated:
            raise PathConfinementError(
                "a computed #include (or __has_include of a macro) can make in-process NVRTC read the "
                "filesystem; compile this source with Config(nvrtc_worker=True)"
            )
        for kind, header in names:
            # Absolute and ".." names would reach the filesystem if not handed over: resolve them now
            # (or refuse). Plain names are resolved on demand, when NVRTC asks.
            if _risky(header) and header not in self.paths:
                self.hand_over_risky(file, kind, header)

    def hand_over_risky(self, includer_file: str | None, kind: str, header: str) -> None:
        """Hand over an absolute or ``..`` ``header``, or raise the one
        :class:`PathConfinementError` whether a file is there outside the roots or
        nowhere: which of the two is no business of the source's."""
        refused = PathConfinementError(f"#include {header!r} does not resolve under a declared root", path=header)
        try:
            handed = self.hand_over(includer_file, kind, header)
        except PathConfinementError:
            raise refused from None
        if not handed:
            raise refused


def _resolve(
    header: str,
    kind: str,
    includer: str | None,
    search_dirs: Sequence[str],
    confine: Callable[[str], str],
    walk: Walk | None = None,
) -> str | None:
    """The confined file an ``#include`` names, searched like a compiler would."""
    if os.path.isabs(header):
        candidates = [header]
    else:
        first = [os.path.dirname(includer)] if includer and kind == '"' else []
        candidates = [os.path.join(d, header) for d in (*first, *search_dirs)]
    for cand in candidates:
        # (walked as the kernel walks it: a name that leads out of the roots on its way — a
        # link in a root whose target passes through an outside dir — is refused whether
        # that dir is there or not)
        if walk is not None and walk.leads_out(cand):
            raise PathConfinementError(f"#include {header!r} does not resolve under a declared root", path=header)
        # (a '..' out of a dir outside the roots is refused whether that dir is there: the
        # kernel climbs out of it only if it is)
        parts = cand.split("/")
        for i in [i for i, part in enumerate(parts) if part == ".."]:
            confine("/".join(parts[:i]) or "/")
        # (a link is confined whether its target is there or not: which, the error would say)
        if os.path.isfile(cand) or os.path.islink(cand):
            return confine(cand)
    return None


def _risky(header: str) -> bool:
    """Whether an include name reaches past its search dirs: absolute, or with a ``..``."""
    return os.path.isabs(header) or ".." in header.split("/")


#: NVRTC allocates and frees some megabytes per compile. A process that hands that back
#: to the kernel on free faults it in again, zeroed, on the next compile (~1300 faults
#: here, about 5% of a small compile); the worker keeps up to 256 MiB of it instead.
#: How long the worker may take to load NVRTC and warm up (not the compile's time).
_START_S: Final = 120.0
_WORKER_MALLOC: Final = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432"


class NvrtcWorker:
    """A persistent NVRTC process that may read only under ``roots`` (nothing at all
    without any), recording NVRTC's lookups with the ``lookups`` library when given
    (see ``worker``)."""

    def __init__(
        self, arch: str, require_landlock: bool, roots: Sequence[str] = (), lookups: str | None = None
    ) -> None:
        self._arch = arch
        self._require = require_landlock
        self.roots = tuple(roots)
        self._library = lookups
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        #: Whether the running worker records lookups (its hello says), and if not, why.
        self.recording = False
        self.why = ""
        #: The Landlock ABI confining the running worker (its hello says whether it is
        #: confined); 0 when none is.
        self.landlock = 0

    def confined(self, timeout: float = _START_S) -> bool:
        """Whether Landlock confines the worker (started now if need be: its hello says)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start(timeout)
            return self.landlock > 0

    def _start(self, timeout: float) -> subprocess.Popen[bytes]:
        # Isolated mode ignores the environment; the parent's import path is handed over
        # explicitly so the worker finds safejit and cuda-python wherever they are installed.
        boot = (
            "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
            "from safejit.backends.cuda.worker import main; sys.exit(main(sys.argv[2:]))"
        )
        argv = [sys.executable, "-I", "-c", boot, json.dumps([p for p in sys.path if p]), self._arch]
        argv += ["--roots", json.dumps(self.roots)]
        if self._library:
            argv += ["--lookups", self._library]
        if self._require:
            argv.append("--require-landlock")
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # TZ: NVRTC's __DATE__ would otherwise have libc look at /etc/localtime on every compile.
            env={"PATH": SYSTEM_PATH, "LC_ALL": "C", "TZ": "UTC0", "GLIBC_TUNABLES": _WORKER_MALLOC},
            close_fds=True,
            process_group=0,
        )
        self._proc = proc
        hello = self._read(proc, timeout, 1 << 16)  # (its hello: a few fields)
        if hello is None:
            self._kill()
            raise CompileError("the NVRTC worker died while starting", log="")
        if hello.get("refused"):
            self._kill()
            raise SandboxUnavailableError(
                f"the NVRTC worker cannot be confined as sandbox='required' asks: {hello['refused']} "
                "(NVRTC loads the CUDA driver, whose thread Landlock would leave unconfined, where one is installed)"
            )
        self.recording, self.why = bool(hello.get("recording")), str(hello.get("why", ""))
        self.landlock = landlock_abi() if hello.get("landlock") is True else 0
        return proc

    @property
    def walls(self) -> str:
        """What the running worker compiles within, as ``safejit.sandbox`` says it:
        ``nvrtc-worker``, then ``landlock-v<ABI>`` when Landlock confines it, and
        ``rlimits`` (its address-space limit)."""
        landlock = [f"landlock-v{self.landlock}"] if self.landlock else []
        return "+".join(["nvrtc-worker", *landlock, "rlimits"])

    def compile_once(self, req: NvrtcRequest, timeout: float = 300.0) -> NvrtcResult:
        """One compile in the worker, started if need be; ``CompileTimeout`` (and the
        worker killed) when the reply takes longer than ``timeout`` seconds from when the
        worker took it. Waiting for the worker (another compile of this Runtime's in it) is
        bounded by ``timeout`` too, and kills nothing: a compile queued behind slow ones had
        its time spent for it, and killed the worker under the one it waited for."""
        msg = json.dumps(
            {
                "code": base64.b64encode(req.code).decode(),
                "name": req.name,
                "options": req.options,
                "name_expressions": req.name_expressions,
                "headers": {k: base64.b64encode(v).decode() for k, v in req.headers.items()},
                "record": req.record,
                "max_cubin": req.max_cubin,
            }
        ).encode()
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            raise CompileTimeout(
                f"{req.name}: the NVRTC worker was busy with other compiles for {timeout:g}s", log="", timeout=timeout
            )
        try:
            deadline = time.monotonic() + timeout
            try:
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    proc = self._start(max(timeout, _START_S))
                    deadline = time.monotonic() + timeout  # (the compile's time starts now)
                if req.record and not self.recording:
                    raise CompileError(f"the NVRTC worker cannot record lookups: {self.why}", log="")
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(struct.pack(">I", len(msg)) + msg)
                proc.stdin.flush()
                reply = self._read(proc, deadline - time.monotonic(), _reply_limit(req))
            except CompileError as exc:  # (other than a timeout: said before a request was sent)
                if isinstance(exc, CompileTimeout):
                    self._kill()
                raise
            except BaseException as exc:
                # Anything else (an OSError, an interrupt in the middle of a read) may leave a
                # reply unread, which the next request would take for its own: another's cubin.
                self._kill()
                if isinstance(exc, OSError) and exc.errno == errno.EMSGSIZE:
                    raise CompileError(str(exc.strerror), log="") from None
                raise
            if reply is None:
                self._kill()
                raise CompileError("the NVRTC worker died", log="")
        finally:
            self._lock.release()
        if reply.get("error") == "E2BIG":
            raise LimitExceededError(f"{req.name}: NVRTC looked up more paths than can be recorded", limit=0)
        lookups = reply.get("lookups")
        return NvrtcResult(
            bool(reply["ok"]),
            str(reply["log"]),
            cubin=base64.b64decode(reply["cubin"]),
            lowered=dict(reply["lowered"]),
            missing=[(str(m[0]), str(m[1])) for m in reply["missing"]],
            lookups=None if lookups is None else [(str(k), int(e), int(f), str(p)) for k, e, f, p in lookups],
            too_large=int(reply.get("too_large", 0)),
        )

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], timeout: float, limit: int) -> dict[str, Any] | None:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        parts: list[bytes] = []
        got, need = 0, 4
        length: int | None = None
        while got < need:
            left = deadline - time.monotonic()
            if not readable(fd, left):
                raise CompileTimeout(f"the NVRTC worker did not answer in {timeout:g}s", log="", timeout=timeout)
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            parts.append(chunk)
            got += len(chunk)
            if length is None and got >= 4:
                (length,) = struct.unpack(">I", b"".join(parts)[:4])
                if length > limit:  # (the worker bounds what it sends: one that does not is not ours)
                    raise OSError(errno.EMSGSIZE, f"the NVRTC worker's reply of {length} bytes is past {limit}")
                need = 4 + length
        data: dict[str, Any] = json.loads(b"".join(parts)[4:need])
        return data

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    def close(self) -> None:
        with self._lock:
            self._kill()


def _reply_limit(req: NvrtcRequest) -> int:
    """The longest reply the worker may send for ``req``: the cubin it may return, encoded,
    the log's head and tail, and the lookups' records (the recorder's buffer, as JSON)."""
    cubin = req.max_cubin if req.max_cubin is not None else 1 << 30
    return 4 * cubin // 3 + (LOG_HEAD + LOG_TAIL) * 8 + (512 << 20)


def library_path() -> str:
    """The NVRTC library this process loads, resolved. Found as cuda.pathfinder finds it
    first (pip wheels, conda) without loading it, when none is loaded yet: a cache hit
    then skips the dlopen of NVRTC (~12 ms here; a compile loads it). Else, or where
    pathfinder's internals are not those of the versions this knows, loaded through
    its public API, which says from where."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    if _finder is not None:
        with contextlib.suppress(Exception):  # (pathfinder's private modules: another version may differ)
            descriptors, loader, steps, context, run_steps = _finder
            desc = descriptors["nvrtc"]
            loaded = loader.check_if_already_loaded_from_elsewhere(desc)
            found = run_steps(context(desc), steps) if loaded is None else None
            if found is not None and os.path.isfile(found.abs_path):
                return os.path.realpath(str(found.abs_path))
    return os.path.realpath(str(load_nvidia_dynamic_lib("nvrtc").abs_path))


try:  # (with the module, as cuda.pathfinder itself: not on a compile's path)
    from cuda.pathfinder._dynamic_libs.lib_descriptor import LIB_DESCRIPTORS
    from cuda.pathfinder._dynamic_libs.platform_loader import LOADER
    from cuda.pathfinder._dynamic_libs.search_steps import EARLY_FIND_STEPS, SearchContext, run_find_steps

    _finder: tuple[Any, ...] | None = (LIB_DESCRIPTORS, LOADER, EARLY_FIND_STEPS, SearchContext, run_find_steps)
except Exception:  # (absent, or another version's layout: the public load is used)
    _finder = None


def nvrtc_failed(name: str, log: str, options: Sequence[str], search_dirs: Sequence[str], shown: str) -> CompileError:
    """NVRTC's failure; a header it could not find is named with the dirs searched. The
    source is named ``shown`` (as the user knows it), not as NVRTC was given it."""
    log = log.replace(f"{PROGRAM_DIR}/{name}.cu", shown)
    text = f"{name}: NVRTC failed\n{log}"
    if "open source file" in log:
        searched = "\n".join(f"  {d}" for d in search_dirs) or "  (none)"
        text += f"\ninclude dirs searched, in order:\n{searched}"
    return CompileError(text, log=log, argv=list(options))
