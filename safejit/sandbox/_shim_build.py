"""Building the exec shim (``shim.c``), the lookup recorder (``lookups.c``) and the
C extensions backends ship (``extensions``): once per user and version, by the
system C compiler, into the private state dir (:mod:`.statedir`), never into a
shared cache root. The runner executes the shim through the descriptor returned
here, opened once and checked: a path swapped afterwards changes nothing. The
recorder is loaded by the NVRTC worker from the private state dir, by path (no one
else may write there); an extension is loaded through its checked descriptor."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile

from ..closure.hashing import digest_bytes
from . import SYSTEM_PATH
from .statedir import StateDir, private_file

__all__ = ["ensure_extension", "ensure_lookups", "ensure_shim", "shim_name"]

logger = logging.getLogger("safejit.sandbox.runner")

_HERE = os.path.dirname(os.path.abspath(__file__))
# (name prefix, what it is, link variants tried in order, a salt for the tag)
_Kind = tuple[str, str, tuple[list[str], ...], bytes]
_SHIM: _Kind = ("shim", "sandbox shim", (["-static"], []), b"static-first")
_LOOKUPS: _Kind = ("lookups", "lookup recorder", (["-shared", "-fPIC"],), b"shared")


def _source(prefix: str) -> bytes:
    # A plain read next to this module (importlib.resources pulls in zipfile: ~7 ms).
    with open(os.path.join(_HERE, f"{prefix}.c"), "rb") as fh:
        return fh.read()


def _name(kind: _Kind, cc: str, source: bytes) -> str:
    prefix, _, variants, salt = kind
    tag = digest_bytes(b"\0".join((source, cc.encode(), salt)))[:16]
    return f"{prefix}-{tag}" + (".so" if "-shared" in variants[0] else "")


def shim_name(cc: str) -> str:
    """The file name of the shim that ``cc`` builds from this version of ``shim.c``."""
    return _name(_SHIM, cc, _source("shim"))


def _open_checked(state: StateDir, name: str, what: str) -> int | None:
    """The file ``name`` of ``state`` (``O_PATH``), if it is a regular file of ours that
    only we may write and that we may execute."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state.fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if private_file(st) and st.st_mode & stat.S_IXUSR:
        return fd
    os.close(fd)
    logger.warning("%s/%s is not a private file of this user; building the %s again", state.shown, name, what)
    return None


def ensure_shim(state: StateDir, cc: str | None) -> int | None:
    """The exec shim (built on first use), opened for execution (``O_PATH``; run it as
    ``/proc/self/fd/<n>``). None: no C compiler, or the build failed."""
    if cc is None:
        logger.warning("no C compiler to build the sandbox shim")
        return None
    return _ensure(state, cc, _SHIM, _source("shim"))


def ensure_lookups(state: StateDir, cc: str | None) -> str | None:
    """The lookup recorder, a shared object (see ``lookups.c``), built on first use: its
    path in the private state dir; None when it cannot be built here."""
    if cc is None:
        return None
    source = _source("lookups")
    # (0755: a compiler run as another user opens it through a descriptor the shim holds,
    # the private dir around it unwalkable to that user)
    fd = _ensure(state, cc, _LOOKUPS, source, mode=0o755)
    if fd is None:
        return None
    os.close(fd)
    return os.path.join(state.shown, _name(_LOOKUPS, cc, source))


def ensure_extension(
    state: StateDir, cc: str, name: str, source: bytes, flags: list[str], salt: bytes
) -> tuple[int, str] | None:
    """A shared object built from C ``source`` with ``flags`` (a Python extension:
    ``-shared -fPIC -I<Python's headers>``; ``salt`` names the interpreter it is for):
    its descriptor (``O_PATH``, checked: load it as ``/proc/self/fd/<n>``) and where it
    is, for messages; None when it cannot be built here."""
    kind: _Kind = (name, f"{name} extension", (flags,), salt)
    fd = _ensure(state, cc, kind, source)
    return None if fd is None else (fd, os.path.join(state.shown, _name(kind, cc, source)))


def _ensure(state: StateDir, cc: str, kind: _Kind, source: bytes, *, mode: int = 0o700) -> int | None:
    prefix, what, variants, _ = kind
    name = _name(kind, cc, source)
    fd = _open_checked(state, name, what)
    if fd is not None:
        return fd
    work = tempfile.mkdtemp(prefix=f"safejit-{prefix}-")
    try:
        with open(os.path.join(work, f"{prefix}.c"), "wb") as fh:
            fh.write(source)
        out = os.path.join(work, prefix)
        for link in variants:  # (the shim: static where the C library allows it, ~0.3 ms less per start)
            proc = subprocess.run(
                [cc, "-O2", *link, "-o", out, os.path.join(work, f"{prefix}.c")],
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
            logger.warning("building the %s failed: %s", what, proc.stderr.decode(errors="replace")[-2000:])
            return None
        with open(out, "rb") as fh:
            binary = fh.read()
        _install(state, name, binary, mode)
        _forget_others(state, prefix, name)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building the %s failed: %s", what, exc)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _open_checked(state, name, what)


def _forget_others(state: StateDir, prefix: str, name: str) -> None:
    """Remove the builds of other versions of the source (or other compilers): a
    process that runs or maps one holds it open, so it goes on working."""
    with contextlib.suppress(OSError), os.scandir(state.path) as entries:
        old = [e.name for e in entries if e.name.startswith(f"{prefix}-") and e.name != name]
    for other in old:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(other, dir_fd=state.fd).st_mode):
                os.unlink(other, dir_fd=state.fd)


def _install(state: StateDir, name: str, binary: bytes, mode: int) -> None:
    """Write ``binary`` as ``name`` in ``state``: a new file of ``mode``, renamed into place."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=state.fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700, dir_fd=state.fd)
    try:
        view = memoryview(binary)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=state.fd, dst_dir_fd=state.fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=state.fd)
        raise
