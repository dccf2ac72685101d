"""The sandboxed runner for every external compiler.

Compilers run as argv lists (never a shell) with stdin closed, a scrubbed
environment, a new process group that is killed on timeout, and output captured
through a pipe (head and tail kept). Around them, by the exec shim (``shim.c``,
built once per user into the private state dir and executed by descriptor; never
a Python callback between fork and exec, which is unsafe in threaded programs):

- Landlock: reads under the declared roots only, writes in the work dir only;
- seccomp (:mod:`.seccomp`): no socket of any family, no other process, no
  namespace or mount of its own;
- a user and mount namespace, in which the work dir is a tmpfs of bounded size;
- never root: a root caller's compiler runs as an unprivileged uid
  (``SAFEJIT_SANDBOX_UID``, else ``nobody``), without supplementary groups;
- rlimits: address space, CPU time, file size, open files, no core files, and
  processes (counted per run in its user namespace).

``Sandbox.describe()`` says which of them a run gets. (One class, the runner with
its spare shims, whose parts share its state: hence the module's length, past the
style's ~450 lines.)
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .. import _env, _forksafe, faults
from .._background import background
from ..errors import CompileError, CompileTimeout, ConfigError, SandboxUnavailableError
from . import SYSTEM_PATH, lookups
from ._closewatch import ClosedFiles, CloseWatch
from ._launch import Shim, ShimStartError, Walls, drain, launch
from ._shim_build import ensure_shim as _ensure_shim
from ._wait import OutputLog, wait_for_exit
from .landlock import abi as landlock_abi
from .seccomp import program_hex as seccomp_program
from .statedir import StateDir, state_dir

__all__ = ["SYSTEM_PATH", "SYSTEM_READ_ROOTS", "Limits", "RunResult", "Sandbox", "landlock_abi"]

logger = logging.getLogger(__name__)
#: How long ``auto`` runs compilers with fewer walls after a shim failed to start with all
#: of them, before it tries all of them again.
_FEWER_WALLS_S: Final = 600.0
#: Why a shim may not start that says nothing of the walls (a moment's shortage).
_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})

#: Read-only for every sandboxed compiler: binaries, shared libraries, loader config.
SYSTEM_READ_ROOTS: Final = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/dev/urandom",
)
_TERM_GRACE_S: Final = 2.0
_PYSHIM: Final = Path(__file__).with_name("_pyshim.py")
#: The shim's own exit codes (shim.c), what each says.
_SHIM_ERRORS: Final = {
    123: "out of processes, memory or descriptors for a moment",
    124: "bad usage",
    125: "a wall unavailable",
    126: "setup failed",
}
#: The walls ``sandbox="required"`` cannot do without.
REQUIRED: Final = ("landlock", "seccomp", "tmpfs", "nproc", "unprivileged")


@dataclass(frozen=True, slots=True)
class Limits:
    address_space: int = 16 << 30
    cpu_s: int = 600
    file_size: int = 2 << 30
    open_files: int = 1024
    #: Processes (threads count too) the run may have at once.
    processes: int = 128
    #: The scratch tmpfs: bytes and inodes, in all.
    scratch_bytes: int = 2 << 30
    scratch_inodes: int = 65536


@dataclass(frozen=True, slots=True)
class RunResult:
    returncode: int
    log: str
    seconds: float
    sandboxed: bool
    #: Watched files as read at their last close, while the process ran (see ``run``).
    files: Mapping[str, bytes] = field(default_factory=dict)
    #: The walls this run had (:meth:`Sandbox.describe`).
    walls: str = ""


def unprivileged_ids() -> tuple[int, int]:
    """The ids a root caller's compiler runs as: ``SAFEJIT_SANDBOX_UID``, else nobody's."""
    given = _env.sandbox_ids()
    if given is not None:
        return given
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        uid = 65534
    for group in ("nogroup", "nobody"):
        with contextlib.suppress(KeyError):
            return uid, grp.getgrnam(group).gr_gid
    return uid, 65534


class Sandbox:
    """Runs argv lists under the configured sandbox mode.

    ``mode`` is ``"auto"`` (every wall this system offers), ``"required"`` (raise
    :class:`SandboxUnavailableError`, before anything runs, when one of
    :data:`REQUIRED` is missing) or ``"off"`` (rlimits and process hygiene only;
    the compiler runs as the caller). ``cc`` builds the exec shim: by default the
    system's ``cc`` on the fixed PATH; None: the Python shim.
    """

    def __init__(
        self, mode: str, *, state: StateDir | None = None, cc: str | None = "", limits: Limits | None = None
    ) -> None:
        if mode not in ("auto", "required", "off"):
            raise ConfigError(f"sandbox mode {mode!r}")
        self.mode = mode
        self.limits = limits or Limits()
        self._state = state
        self._cc = cc
        self._ids_known: tuple[tuple[int, int] | None] | None = None  # (looked up at the first run)
        self._exe: tuple[list[str], tuple[int, ...]] | None = None
        self._exe_lock = _forksafe.Lock()
        self._builder: int | None = None  # (the thread building the shim or recorder, while it does)
        self._recorder: tuple[str | None] | None = None  # (looked for with the shim)
        self._walls: Walls | None = None
        self._abi = -1
        self._described: tuple[Walls, str] | None = None
        #: Until when (``time.monotonic()``) shims start with fewer walls: one failed to
        #: start with all of them (``auto``). Not for good: a failure of a moment (out of
        #: processes in the shim, a report late under load) is no missing wall.
        self._degraded_until = 0.0
        #: The shims started with fewer walls (a spare among them is not used once that ends).
        self._fewer: weakref.WeakSet[Shim] = weakref.WeakSet()
        # The shim started ahead: [Shim] or []. A list, so that the finalizer below can
        # end it when this Sandbox goes without close().
        self._spares: list[Shim] = []
        self._spare_lock = _forksafe.Lock()
        self._closed = False
        weakref.finalize(self, _retire_all, self._spares, self._spare_lock)

    @property
    def ids(self) -> tuple[int, int] | None:
        """The unprivileged ids a root caller's compiler runs as (None: the caller's own).
        Looked up (NSS: the passwd and group files) when a run first needs them, not when
        the Runtime is set up: a cache hit runs nothing."""
        if self._ids_known is None:
            self._ids_known = (unprivileged_ids() if os.geteuid() == 0 and self.mode != "off" else None,)
        return self._ids_known[0]

    # -- what runs get ----------------------------------------------------------------
    @property
    def walls(self) -> Walls:
        """What a shim of this sandbox prepares (one is started to find out, and kept
        for the next run). Raises :class:`SandboxUnavailableError` when none starts."""
        if self._walls is None:
            self._keep(self._launch())
        assert self._walls is not None
        return self._walls

    @property
    def landlock(self) -> bool:
        return self.mode != "off" and self._landlock_abi() > 0

    def _landlock_abi(self) -> int:
        """The Landlock ABI runs get: this kernel's, as the shim found it too."""
        if self._abi < 0:
            self._abi = min(landlock_abi(), self.walls.landlock)
        return self._abi

    def describe(self) -> str:
        """The walls every run gets, joined by ``+``: ``landlock-v<ABI>``, ``seccomp``,
        ``userns``, ``tmpfs`` (the bounded scratch), ``uid-<n>`` (a root caller's compiler
        runs as uid n), ``nproc`` (a process limit), ``rlimits`` (always)."""
        return self._describe(None)

    def _describe(self, walls: Walls | None) -> str:
        """:meth:`describe` of ``walls`` (a shim's own; None: the last one started's)."""
        if self.mode == "off":
            return "rlimits"
        w = walls if walls is not None else self.walls
        if self._described is not None and self._described[0] is w:
            return self._described[1]
        parts = [f"landlock-v{self._landlock_abi()}"] if self.landlock else []
        parts += [name for name, on in (("seccomp", w.seccomp), ("userns", w.userns), ("tmpfs", w.scratch)) if on]
        if self.ids is not None:
            parts.append(f"uid-{w.uid}")
        if w.nproc:
            parts.append("nproc")
        self._described = (w, "+".join([*parts, "rlimits"]))
        return self._described[1]

    def missing(self) -> list[str]:
        """The walls of :data:`REQUIRED` a run would lack."""
        w = self.walls
        have = {
            "landlock": self.landlock,
            "seccomp": w.seccomp,
            "tmpfs": w.scratch,
            "nproc": w.nproc,
            "unprivileged": w.uid != 0,
        }
        return [name for name in REQUIRED if not have[name]]

    def check_available(self) -> None:
        """With ``sandbox="required"``: raise :class:`SandboxUnavailableError` unless every
        wall is there (a shim is started to find out, and kept for the first run)."""
        if self.mode != "required":
            return
        missing = self.missing()
        if missing:
            raise SandboxUnavailableError(
                f"sandbox='required' but this system offers no {', '.join(missing)} (it offers: {self.describe()})",
                missing=missing,
                landlock_abi=landlock_abi(),
            )

    # -- shims -------------------------------------------------------------------------
    def _executable(self) -> tuple[list[str], tuple[int, ...]]:
        """The shim's argv prefix and the descriptors it needs: the C shim (built on first
        use, executed through its descriptor), else the Python one."""
        if self._exe is None:
            fallback = False
            with self._building():
                if self._exe is None:
                    state = self._state if self._state is not None else state_dir()
                    # The shim is built by the system compiler (by default: ``cc`` on the
                    # fixed PATH, looked up now), never by a configured one.
                    cc = shutil.which("cc", path=SYSTEM_PATH) if self._cc == "" else self._cc
                    fd = _ensure_shim(state, cc)
                    if fd is None:
                        fallback = True
                        self._exe = ([sys.executable, "-I", "-S", str(_PYSHIM)], ())
                    else:
                        weakref.finalize(self, _close_quietly, fd, os.getpid())
                        self._exe = ([f"/proc/self/fd/{fd}"], (fd,))
            if fallback:  # (said once the lock is let go: a handler may start a sandbox)
                logger.warning("using the Python sandbox shim (slower start) in place of the C one")
        return self._exe

    @contextlib.contextmanager
    def _building(self) -> Iterator[None]:
        """``_exe_lock``, held while the shim or recorder is built (what that logs may reach
        a handler that starts a run from the same thread: told so, never waiting on itself)."""
        if self._builder == threading.get_ident():
            raise SandboxUnavailableError("the sandbox was called into while it was being set up, by the same thread")
        with self._exe_lock:
            self._builder = threading.get_ident()
            try:
                yield
            finally:
                self._builder = None

    def recorder(self) -> str | None:
        """The lookup recorder each run's processes may preload (``lookups.c``: GCC's
        preprocessors record every path they look up), built with the shim by the same
        compiler; None where it cannot run here. Each shim holds it open for its program
        (``-L``), which may be another user who could not walk to it."""
        if self._recorder is None:
            with self._building():
                if self._recorder is None:
                    state = self._state if self._state is not None else state_dir()
                    cc = shutil.which("cc", path=SYSTEM_PATH) if self._cc == "" else self._cc
                    self._recorder = (lookups.build(state, cc),)
        return self._recorder[0]

    def preload_env(self) -> dict[str, str]:
        """The environment that has a run's processes load the recorder (see
        :meth:`recorder`); empty where there is none."""
        return lookups.preload_env(f"/proc/self/fd/{lookups.PRELOAD_FD}") or {} if self.recorder() else {}

    @property
    def _degraded(self) -> bool:
        return time.monotonic() < self._degraded_until

    def _ahead_options(self, fewer: bool = False) -> list[str]:
        """What a shim prepares before its run is known (the same for every run); ``fewer``:
        no namespaces, scratch, seccomp or other uid (``auto``, a while after a shim could
        not put all of them up)."""
        opts = ["-R"]
        recorder = self.recorder()
        if recorder is not None:
            opts += ["-L", recorder]
        if self.mode == "off" or fewer:
            return opts
        lim = self.limits
        opts += ["-U", "-T", str(lim.scratch_bytes), "-i", str(lim.scratch_inodes)]
        if self.ids is not None:
            opts += ["-u", str(self.ids[0]), "-g", str(self.ids[1])]
        program = seccomp_program()
        if program is not None:
            opts += ["-S", program]
        return opts

    def _launch(self) -> Shim:
        """A new shim. Raises :class:`SandboxUnavailableError` when none starts (in
        ``"auto"``, after trying once more without namespaces, the scratch and seccomp)."""
        prefix, fds = self._executable()
        fewer = self._degraded
        try:
            shim = launch([*prefix, *self._ahead_options(fewer)], pass_fds=fds, owner=self.ids)
        except ShimStartError as exc:
            # Fewer walls only on the shim's own word that one cannot be put up: not for a
            # shim killed (a compiler of the same uid could), late under load, or short of
            # descriptors, processes or memory for a moment.
            if self.mode != "auto" or fewer or not exc.verdict:
                raise SandboxUnavailableError(str(exc), missing=list(REQUIRED)) from exc
            logger.warning("%s; running compilers with fewer walls for %g s", exc, _FEWER_WALLS_S)
            self._degraded_until = time.monotonic() + _FEWER_WALLS_S
            try:
                shim = launch([*prefix, *self._ahead_options(True)], pass_fds=fds, owner=self.ids)
            except ShimStartError as again:
                raise SandboxUnavailableError(str(again), missing=list(REQUIRED)) from again
            fewer = True
        if fewer:
            self._fewer.add(shim)
        if self._walls is None or shim.walls != self._walls:  # (fewer, or all of them again)
            self._walls, self._abi = shim.walls, -1
        return shim

    def _keep(self, shim: Shim) -> None:
        """Keep ``shim`` for the next run, unless one is kept already or this is closed."""
        with self._spare_lock:
            kept = not self._spares and not self._closed
            if kept:
                self._spares.append(shim)
        if not kept:  # another thread was quicker, or the sandbox was closed meanwhile
            shim.retire()

    def _prepare_spare(self) -> None:
        """Start the shim for the next run (its start, and what it prepares, are off the
        compile's path)."""
        if self._spares or self._closed:
            return
        try:
            shim = self._launch()
        except (SandboxUnavailableError, OSError) as exc:
            logger.debug("could not start a spare shim: %s", exc)
            return
        self._keep(shim)

    def _take(self) -> Shim:
        """The shim started ahead, if one is ready; else one started now."""
        with self._spare_lock:
            shim = self._spares.pop() if self._spares else None
        if shim is not None and shim in self._fewer and not self._degraded:
            shim.retire()  # (made with fewer walls while that lasted: all of them are tried again)
            shim = None
        if shim is not None and shim.owner == os.getpid():
            return shim
        return self._launch()  # (a spare made before a fork belongs to the parent: leave it be)

    @property
    def _spare(self) -> Shim | None:
        return self._spares[0] if self._spares else None

    def close(self) -> None:
        """End the shim started ahead, if any; none is started after this."""
        with self._spare_lock:
            self._closed = True
        _retire_all(self._spares, self._spare_lock)

    # -- a run -------------------------------------------------------------------------
    def _command(
        self, shim: Shim, argv: Sequence[str], cwd: str, env: Mapping[str, str], read_roots: Sequence[str],
        write_roots: Sequence[str],
    ) -> tuple[list[str], bool]:  # fmt: skip
        """The run's command for ``shim``, and whether Landlock applies."""
        lim = self.limits
        opts = ["-a", str(lim.address_space), "-c", str(lim.cpu_s), "-f", str(lim.file_size),
                "-n", str(lim.open_files), "-p", str(lim.processes)]  # fmt: skip
        landlocked = self.landlock
        if landlocked:
            recorder = self.recorder() if "LD_PRELOAD" in env else None  # (a run that preloads it)
            for root in (*SYSTEM_READ_ROOTS, *read_roots, *((recorder,) if recorder else ())):
                opts += ["-r", root]
            for root in (*write_roots, "/dev/null"):
                opts += ["-w", root]
            opts.append("-N")
        if shim.scratch is not None and cwd in write_roots:
            opts += ["-M", cwd]
        elif self.ids is not None and shim.walls.uid != 0 and cwd in write_roots:
            opts += ["-H", cwd]  # (root without the scratch tmpfs: the work dir is handed over)
        return [*opts, "-C", cwd, *_env_options(env), "--", *argv], landlocked

    def _start(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str], read_roots: Sequence[str],
        write_roots: Sequence[str],
    ) -> tuple[Shim, bool]:  # fmt: skip
        """Hand the run to a shim; returns it and whether Landlock applies. A shim that
        died while waiting is replaced once."""
        for attempt in (0, 1):
            shim = self._take() if attempt == 0 else self._launch()
            command, landlocked = self._command(shim, argv, cwd, env, read_roots, write_roots)
            try:
                shim.submit(command)
            except OSError as exc:
                own = _own_error(*_ended(shim)) if attempt else None
                shim.retire()
                if own is not None:  # (it died saying why: the same error as had it said so after the command)
                    raise own from exc
                if attempt:
                    raise CompileError(f"could not start {argv[0]}: {exc}", log=str(exc), argv=list(argv)) from exc
                continue
            return shim, landlocked
        raise AssertionError("unreachable")  # pragma: no cover

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        read_roots: Sequence[str] = (),
        write_roots: Sequence[str] = (),
        on_start: Callable[[], None] | None = None,
        watch: Sequence[str] = (),
        on_closed: Callable[[str, bytes], None] | None = None,
        watch_limit: int | None = None,
    ) -> RunResult:
        """Run ``argv`` in ``cwd``; raise :class:`CompileTimeout` past ``timeout``.
        ``on_start`` runs once the process is started (work to overlap with it).

        ``watch``: files (of one directory) the process writes. Each time it closes one
        after writing, while it still runs, the file is read and ``on_closed(path, data)``
        called; ``RunResult.files`` holds what was read at the last close, for the files
        known not to have changed since (none where inotify is not to be had). A file
        larger than ``watch_limit`` bytes is not read then.

        Where the shim offers a scratch tmpfs and ``cwd`` is a write root, the process
        works in the tmpfs mounted on ``cwd`` (what ``cwd`` held is copied in first);
        the regular files it leaves at the top of it are copied back into ``cwd``
        before the run ends. Where a root caller's compiler runs as another uid with
        no tmpfs, ``cwd`` (its private parts) is handed over to that uid."""
        self.check_available()
        try:
            faults.point("compiler.spawn")
        except OSError as exc:
            raise CompileError(f"could not start {argv[0]}: {exc}", log=str(exc), argv=list(argv)) from exc
        log = OutputLog()
        start = time.perf_counter()
        files: dict[str, bytes] = {}
        shim, landlocked = self._start(argv, cwd, env, read_roots, write_roots)
        scratch = shim.scratch if shim.scratch is not None and cwd in write_roots else None
        closes = None
        try:
            view = scratch.view if scratch else None
            closes = CloseWatch.open(watch, view=view, limit=watch_limit) if watch else None
            rc = self._wait(shim, argv, timeout, log, closes, files, on_start, on_closed)
        except CompileTimeout:
            if scratch is not None:  # (killed: nothing came back from its scratch but this)
                lookups.keep_records(scratch.view, cwd)
            raise
        finally:
            if closes is not None:
                closes.close()
            shim.close()
        text = log.text()
        own = _own_error(rc, text)
        if own is not None:
            raise own
        # (the walls of the shim that ran it: another started since may have more, or fewer)
        return RunResult(rc, text, time.perf_counter() - start, landlocked, files, self._describe(shim.walls))

    def _wait(
        self, shim: Shim, argv: Sequence[str], timeout: float, log: OutputLog, closes: CloseWatch | None,
        files: dict[str, bytes], on_start: Callable[[], None] | None,
        on_closed: Callable[[str, bytes], None] | None,
    ) -> int:  # fmt: skip
        proc = shim.proc
        # The shim for the next run starts while this one's compiler works (after it
        # exits, its start would compete with this run's own finishing work).
        background().submit(self._prepare_spare)
        reported = False
        try:
            if on_start is not None:
                on_start()
            reader = ClosedFiles(closes, files, on_closed) if closes else None
            rc, reported = wait_for_exit(proc, timeout, shim.output, log, reader, pidfd=shim.pidfd, status=shim.sock)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            log.drain(shim.output)
            raise CompileTimeout(
                f"compiler ran past {timeout:g}s and was killed: {argv[0]}",
                log=log.text(),
                argv=list(argv),
                timeout=timeout,
            ) from None
        finally:
            if not reported and proc.returncode is None:  # interrupted: never leave the group running
                _kill_group(proc)
        if reported:
            # Everything it started is gone; the shim's own exit (its namespaces' teardown)
            # is reaped off this path.
            background().submit(_reap, proc)
        else:
            _kill_group(proc, quiet=True)  # the group may hold stragglers (a driver's children)
        log.drain(shim.output)
        if closes is not None:  # a file closed since (by a straggler) is read afresh
            try:
                for path, _ in closes.closed():
                    files.pop(path, None)
            except OSError:
                files.clear()
        return rc


def _own_error(rc: int | None, text: str) -> Exception | None:
    """The error a shim's own exit (``rc``, with its ``safejit-shim:`` message in ``text``)
    stands for, None for any other: a wall unavailable, or a shortage of processes, memory
    or descriptors (for a moment: never a wall that cannot be had), is the sandbox's; bad
    usage or a setup that failed another way, a ``ConfigError``."""
    if rc not in _SHIM_ERRORS or "safejit-shim:" not in text:
        return None
    said = f"sandbox: {_SHIM_ERRORS[rc]}: {text.strip()[-2000:]}"
    return SandboxUnavailableError(said) if rc in (123, 125) else ConfigError(said)


def _ended(shim: Shim) -> tuple[int | None, str]:
    """How a shim that refused its command ended: its exit code (None if it has not, within
    a second), and what it wrote."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        shim.proc.wait(timeout=1)
    return shim.proc.returncode, drain(shim.output) if shim.output >= 0 else ""


def _env_options(env: Mapping[str, str]) -> list[str]:
    out = []
    for name, value in env.items():
        out += ["-E", f"{name}={value}"]
    return out or ["-E", "LC_ALL=C"]  # -E given at all replaces the environment


def _close_quietly(fd: int, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.close(fd)


def _retire_all(spares: list[Shim], lock: threading.Lock) -> None:
    with lock:
        mine = [s for s in spares if s.owner == os.getpid()]
        spares.clear()
    for shim in mine:
        shim.retire()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Reap a shim that has reported its run's end (it is exiting)."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a shim stuck after its report
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes], *, quiet: bool = False) -> None:
    """End the run: SIGTERM lets the shim kill every descendant it reaped (even
    those that left the process group); SIGKILL to the group is the fallback."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_TERM_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if not quiet or proc.returncode is None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable process
            logger.error("process group %d did not exit after SIGKILL", proc.pid)
