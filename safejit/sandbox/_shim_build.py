"""Building the exec shim (``shim.c``) and the lookup recorder (``lookups.c``): once
per user and version, by the system C compiler, into a private directory (0700,
owned by this user)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from ..closure.hashing import digest_bytes
from . import SYSTEM_PATH

__all__ = ["ensure_lookups", "ensure_shim"]

logger = logging.getLogger("safejit.sandbox.runner")


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _private_dir(path: Path) -> bool:
    """True when ``path`` is a real directory owned by us and closed to others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _temporary_private_dir() -> Path:
    path = tempfile.mkdtemp(prefix="safejit-tools-")
    atexit.register(shutil.rmtree, path, True)
    return Path(path)


def ensure_shim(tools_dir: str | None, cc: str | None) -> str | None:
    """Build (once per user and shim version) and return the exec shim."""
    if cc is None:
        logger.warning("no C compiler to build the sandbox shim; compilers run without rlimits or Landlock")
        return None
    # Static where the C library allows it: no dynamic loading on each start (~0.3 ms).
    return _ensure("shim.c", "shim", "sandbox shim", tools_dir, cc, (["-static"], []), "static-first")


def ensure_lookups(tools_dir: str | None, cc: str | None) -> str | None:
    """Build (once per user and version) and return the lookup recorder, a shared
    object (see ``lookups.c``); None when it cannot be built here."""
    if cc is None:
        return None
    return _ensure("lookups.c", "lookups", "lookup recorder", tools_dir, cc, (["-shared", "-fPIC"],), "shared")


def _ensure(
    source_name: str,
    name: str,
    what: str,
    tools_dir: str | None,
    cc: str,
    variants: tuple[list[str], ...],
    salt: str,
) -> str | None:
    source = resources.files("safejit.sandbox").joinpath(source_name).read_bytes()
    tag = digest_bytes(source + b"\0" + cc.encode() + b"\0" + salt.encode())[:16]
    base = Path(tools_dir) if tools_dir else Path(tempfile.gettempdir())
    private = base / f"u{os.geteuid()}"
    try:
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        private = _temporary_private_dir()
    if not _private_dir(private):
        logger.warning("%s is not a private directory; building the %s in a temporary one", private, what)
        private = _temporary_private_dir()
    target = private / f"{name}-{tag}{'.so' if '-shared' in variants[0] else ''}"
    try:
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return str(target)
    except FileNotFoundError:
        pass
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=private))
    try:
        (work / source_name).write_bytes(source)
        out = work / name
        for link in variants:
            proc = subprocess.run(
                [cc, "-O2", *link, "-o", str(out), str(work / source_name)],
                cwd=work,
                env={"PATH": SYSTEM_PATH, "TMPDIR": str(work), "LC_ALL": "C"},
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
        os.chmod(out, 0o700)
        os.replace(out, target)
        return str(target)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building the %s failed: %s", what, exc)
        return None
    finally:
        for child in work.iterdir() if work.exists() else ():
            _unlink_quiet(str(child))
        with contextlib.suppress(OSError):
            work.rmdir()
