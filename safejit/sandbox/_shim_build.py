"""Building the exec shim (``shim.c``): once per user and shim version, by the
system C compiler, into the private state dir (:mod:`.statedir`), never into a
shared cache root. The runner executes it through the descriptor returned here,
opened once and checked: a path swapped afterwards changes nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from importlib import resources

from ..closure.hashing import digest_bytes
from . import SYSTEM_PATH
from .statedir import StateDir, private_file

__all__ = ["ensure_shim", "shim_name"]

logger = logging.getLogger("safejit.sandbox.runner")


def shim_name(cc: str) -> str:
    """The file name of the shim that ``cc`` builds from this version of ``shim.c``."""
    source = resources.files("safejit.sandbox").joinpath("shim.c").read_bytes()
    tag = digest_bytes(b"\0".join((source, cc.encode(), b"static-first")))[:16]
    return f"shim-{tag}"


def _open_checked(state: StateDir, name: str) -> int | None:
    """The shim ``name`` of ``state`` (``O_PATH``), if it is a regular file of ours that
    only we may write and that we may execute."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state.fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if private_file(st) and st.st_mode & stat.S_IXUSR:
        return fd
    os.close(fd)
    logger.warning("%s/%s is not a private file of this user; building the shim again", state.shown, name)
    return None


def ensure_shim(state: StateDir, cc: str | None) -> int | None:
    """The exec shim (built on first use), opened for execution (``O_PATH``; run it as
    ``/proc/self/fd/<n>``). None: no C compiler, or the build failed."""
    if cc is None:
        logger.warning("no C compiler to build the sandbox shim")
        return None
    name = shim_name(cc)
    fd = _open_checked(state, name)
    if fd is not None:
        return fd
    source = resources.files("safejit.sandbox").joinpath("shim.c").read_bytes()
    work = tempfile.mkdtemp(prefix="safejit-shim-")
    try:
        with open(os.path.join(work, "shim.c"), "wb") as fh:
            fh.write(source)
        out = os.path.join(work, "shim")
        # Static where the C library allows it: no dynamic loading on each start (~0.3 ms).
        for link in (["-static"], []):
            proc = subprocess.run(
                [cc, "-O2", *link, "-o", out, os.path.join(work, "shim.c")],
                cwd=work,
                env={"PATH": SYSTEM_PATH, "TMPDIR": work, "LC_ALL": "C"},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                check=False,
            )
            if proc.returncode == 0:
                break
        if proc.returncode != 0:
            logger.warning("building the sandbox shim failed: %s", proc.stderr.decode(errors="replace")[-2000:])
            return None
        with open(out, "rb") as fh:
            binary = fh.read()
        _install(state, name, binary)
        _forget_others(state, name)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building the sandbox shim failed: %s", exc)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _open_checked(state, name)


def _forget_others(state: StateDir, name: str) -> None:
    """Remove the shims of other versions of ``shim.c`` (or other compilers): a process
    that runs one holds it open, so it goes on working."""
    with contextlib.suppress(OSError), os.scandir(state.path) as entries:
        old = [e.name for e in entries if e.name.startswith("shim-") and e.name != name]
    for other in old:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(other, dir_fd=state.fd).st_mode):
                os.unlink(other, dir_fd=state.fd)


def _install(state: StateDir, name: str, binary: bytes) -> None:
    """Write ``binary`` as ``name`` in ``state``: a new file (0700), renamed into place."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=state.fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700, dir_fd=state.fd)
    try:
        view = memoryview(binary)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o700)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=state.fd, dst_dir_fd=state.fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=state.fd)
        raise
