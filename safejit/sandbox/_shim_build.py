"""Building the exec shim (``shim.c``): once per user and shim version, by the
system C compiler, into a private directory (0700, owned by this user)."""

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

__all__ = ["ensure_shim"]

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
    source = resources.files("safejit.sandbox").joinpath("shim.c").read_bytes()
    tag = digest_bytes(source + b"\0" + cc.encode() + b"\0static-first")[:16]
    base = Path(tools_dir) if tools_dir else Path(tempfile.gettempdir())
    private = base / f"u{os.geteuid()}"
    try:
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        private = _temporary_private_dir()
    if not _private_dir(private):
        logger.warning("%s is not a private directory; building the shim in a temporary one", private)
        private = _temporary_private_dir()
    target = private / f"shim-{tag}"
    try:
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return str(target)
    except FileNotFoundError:
        pass
    work = Path(tempfile.mkdtemp(prefix=".shim-", dir=private))
    try:
        (work / "shim.c").write_bytes(source)
        out = work / "shim"
        # Static where the C library allows it: no dynamic loading on each start (~0.3 ms).
        for link in (["-static"], []):
            proc = subprocess.run(
                [cc, "-O2", *link, "-o", str(out), str(work / "shim.c")],
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
            logger.warning("building the sandbox shim failed: %s", proc.stderr.decode(errors="replace")[-2000:])
            return None
        os.chmod(out, 0o700)
        os.replace(out, target)
        return str(target)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building the sandbox shim failed: %s", exc)
        return None
    finally:
        for child in work.iterdir() if work.exists() else ():
            _unlink_quiet(str(child))
        with contextlib.suppress(OSError):
            work.rmdir()
