"""The sandboxed runner for every external compiler.

Compilers run as argv lists (never a shell) with stdin closed, a scrubbed
environment, a new process group that is killed on timeout, rlimits, output
captured through a pipe (head and tail kept), and Landlock where the kernel offers it.
Limits and Landlock are applied by a small exec shim (``shim.c``, built once
per user and kept in a private directory) — never by a Python callback between
fork and exec, which is unsafe in threaded programs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .. import faults
from .._background import background
from ..errors import CompileError, CompileTimeout, ConfigError, SandboxUnavailableError
from . import SYSTEM_PATH
from ._closewatch import ClosedFiles, CloseWatch
from ._shim_build import ensure_shim as _ensure_shim
from ._wait import OutputLog, wait_for_exit
from .landlock import abi as landlock_abi

__all__ = ["SYSTEM_PATH", "SYSTEM_READ_ROOTS", "Limits", "RunResult", "Sandbox", "landlock_abi"]

logger = logging.getLogger(__name__)

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
_SHIM_ERRORS: Final = {124: "bad usage", 125: "Landlock unavailable", 126: "sandbox setup failed"}


@dataclass(frozen=True, slots=True)
class Limits:
    address_space: int = 16 << 30
    cpu_s: int = 600
    file_size: int = 2 << 30
    open_files: int = 1024


@dataclass(frozen=True, slots=True)
class RunResult:
    returncode: int
    log: str
    seconds: float
    sandboxed: bool
    #: Watched files as read at their last close, while the process ran (see ``run``).
    files: Mapping[str, bytes] = field(default_factory=dict)


class Sandbox:
    """Runs argv lists under the configured sandbox mode.

    ``mode`` is ``"auto"`` (Landlock when offered), ``"required"`` (raise
    :class:`SandboxUnavailableError` without it) or ``"off"`` (limits and
    process hygiene only, no Landlock).
    """

    def __init__(self, mode: str, *, tools_dir: str | None, cc: str | None, limits: Limits | None = None) -> None:
        if mode not in ("auto", "required", "off"):
            raise ConfigError(f"sandbox mode {mode!r}")
        self.mode = mode
        self.limits = limits or Limits()
        self._tools_dir = tools_dir
        self._cc = cc
        self._shim: list[str] | None = None
        self._c_shim: str | None = None
        self._shim_lock = threading.Lock()
        # The shim started ahead: [(owner pid, process, output read end)] or []. A list, so
        # that the finalizer below can end it when this Sandbox goes without close().
        self._spares: list[tuple[int, subprocess.Popen[bytes], int]] = []
        self._spare_lock = threading.Lock()
        self._closed = False
        self._abi = -1
        weakref.finalize(self, _retire_all, self._spares, self._spare_lock)

    @property
    def landlock(self) -> bool:
        if self._abi < 0:
            self._abi = landlock_abi()
        return self.mode != "off" and self._abi > 0

    def describe(self) -> str:
        return "landlock" if self.landlock else "rlimits"

    def check_available(self) -> None:
        if self.mode == "required" and not self.landlock:
            raise SandboxUnavailableError(
                "sandbox='required' but Landlock or the exec shim is unavailable on this system",
                landlock_abi=landlock_abi(),
            )

    def shim(self) -> list[str]:
        """The exec shim's argv prefix: the C shim (built on first use), else the
        Python one (same behaviour, ~15 ms slower to start)."""
        if self._shim is None:
            with self._shim_lock:
                if self._shim is None:
                    built = _ensure_shim(self._tools_dir, self._cc)
                    if built is None:
                        logger.warning("using the Python sandbox shim (slower start) in place of the C one")
                    self._c_shim = built
                    self._shim = [built] if built else [sys.executable, "-I", "-S", str(_PYSHIM)]
        return self._shim

    def _hand_to_spare(self, command: Sequence[str]) -> tuple[subprocess.Popen[bytes], int] | None:
        """Give ``command`` to the shim started ahead, if one is ready: its process
        and the read end of its output pipe. None: start one the usual way."""
        with self._spare_lock:
            spare = self._spares.pop() if self._spares else None
        if spare is None or spare[0] != os.getpid():
            return None  # (a spare made before a fork belongs to the parent: leave it be)
        _, proc, read_fd = spare
        body = b"".join(os.fsencode(a) + b"\0" for a in command)
        assert proc.stdin is not None
        try:
            proc.stdin.write(len(body).to_bytes(4, "little") + body)
            proc.stdin.close()
        except OSError:  # it died while waiting (killed from outside): start one now
            _retire(proc, read_fd)
            return None
        return proc, read_fd

    def _prepare_spare(self, shim: Sequence[str]) -> None:
        """Start the shim for the next run (the C shim only: it reads ``-R`` requests)."""
        if self._c_shim is None or self._spares or self._closed:
            return
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            proc = subprocess.Popen(
                [self._c_shim, "-R"],
                cwd="/",
                env={},
                stdin=subprocess.PIPE,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                close_fds=True,
                process_group=0,
            )
        except OSError as exc:
            os.close(read_fd)
            logger.debug("could not start a spare shim: %s", exc)
            return
        finally:
            os.close(write_fd)
        with self._spare_lock:
            kept = not self._spares and not self._closed
            if kept:
                self._spares.append((os.getpid(), proc, read_fd))
        if not kept:  # another thread was quicker, or the sandbox was closed meanwhile
            _retire(proc, read_fd)

    @property
    def _spare(self) -> tuple[int, subprocess.Popen[bytes], int] | None:
        return self._spares[0] if self._spares else None

    def close(self) -> None:
        """End the shim started ahead, if any; none is started after this."""
        with self._spare_lock:
            self._closed = True
        _retire_all(self._spares, self._spare_lock)

    def _start(
        self, shim: list[str], opts: list[str], argv: Sequence[str], cwd: str, env: Mapping[str, str]
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start ``argv`` under the shim; returns the process and its output's read end."""
        # A shim started ahead takes the whole command on its stdin (-R): starting a
        # process costs ~1 ms (fork, exec, loading), none of it while the compile waits.
        started = self._hand_to_spare([*opts, "-C", cwd, *_env_options(env), "--", *argv])
        if started is not None:
            return started
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            proc = subprocess.Popen(
                [*shim, *opts, "--", *argv],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                close_fds=True,
                process_group=0,
                shell=False,
            )
        except OSError as exc:
            os.close(read_fd)
            raise CompileError(f"could not start {argv[0]}: {exc}", log=str(exc), argv=list(argv)) from exc
        finally:
            os.close(write_fd)
        return proc, read_fd

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
    ) -> RunResult:
        """Run ``argv`` in ``cwd``; raise :class:`CompileTimeout` past ``timeout``.
        ``on_start`` runs once the process is started (work to overlap with it).

        ``watch``: files (of one directory) the process writes. Each time it closes one
        after writing, while it still runs, the file is read and ``on_closed(path, data)``
        called; ``RunResult.files`` holds what was read at the last close, for the files
        known not to have changed since (none where inotify is not to be had)."""
        self.check_available()
        limits = self.limits
        opts = ["-a", str(limits.address_space), "-c", str(limits.cpu_s),
                "-f", str(limits.file_size), "-n", str(limits.open_files)]  # fmt: skip
        landlocked = self.landlock
        if landlocked:
            for root in (*SYSTEM_READ_ROOTS, *read_roots):
                opts += ["-r", root]
            for root in (*write_roots, "/dev/null"):
                opts += ["-w", root]
            opts += ["-N", *(["-L"] if self.mode == "required" else [])]
        log = OutputLog()
        shim = self.shim()
        start = time.perf_counter()
        try:
            faults.point("compiler.spawn")
        except OSError as exc:
            raise CompileError(f"could not start {argv[0]}: {exc}", log=str(exc), argv=list(argv)) from exc
        closes = CloseWatch.open(watch) if watch else None
        files: dict[str, bytes] = {}
        try:
            proc, read_fd = self._start(shim, opts, argv, cwd, env)
            try:
                # The shim for the next run starts while this one's compiler works (after
                # it exits, its start would compete with this run's own finishing work).
                background().submit(self._prepare_spare, shim)
                if on_start is not None:
                    on_start()
                try:
                    rc = wait_for_exit(
                        proc, timeout, read_fd, log, ClosedFiles(closes, files, on_closed) if closes else None
                    )
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    log.drain(read_fd)
                    raise CompileTimeout(
                        f"compiler ran past {timeout:g}s and was killed: {argv[0]}",
                        log=log.text(),
                        argv=list(argv),
                        timeout=timeout,
                    ) from None
                finally:
                    if proc.poll() is None:  # interrupted: never leave the group running
                        _kill_group(proc)
                # The group may hold stragglers (a driver's children); end them too.
                _kill_group(proc, quiet=True)
                log.drain(read_fd)
                if closes is not None:  # a file closed since (by a straggler) is read afresh
                    try:
                        for path, _ in closes.closed():
                            files.pop(path, None)
                    except OSError:
                        files.clear()
            finally:
                os.close(read_fd)
        finally:
            if closes is not None:
                closes.close()
        text = log.text()
        if rc in _SHIM_ERRORS and "safejit-shim:" in text:
            if rc == 125:
                raise SandboxUnavailableError(f"sandbox: {text.strip()}")
            raise ConfigError(f"sandbox {_SHIM_ERRORS[rc]}: {text.strip()}")
        return RunResult(rc, text, time.perf_counter() - start, landlocked, files)


def _env_options(env: Mapping[str, str]) -> list[str]:
    out = []
    for name, value in env.items():
        out += ["-E", f"{name}={value}"]
    return out or ["-E", "LC_ALL=C"]  # -E given at all replaces the environment


def _retire_all(spares: list[tuple[int, subprocess.Popen[bytes], int]], lock: threading.Lock) -> None:
    with lock:
        mine = [s for s in spares if s[0] == os.getpid()]
        spares.clear()
    for _, proc, read_fd in mine:
        _retire(proc, read_fd)


def _retire(proc: subprocess.Popen[bytes], read_fd: int) -> None:
    """End a spare shim that never got a command: EOF on its stdin makes it exit."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    os.close(read_fd)


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
