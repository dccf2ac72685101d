"""Helpers shared by the security tests: outside files, wrapper compilers and
the "nothing was published" check every refusal ends with."""

from __future__ import annotations

from pathlib import Path

import pytest

from safejit.sandbox.runner import landlock_abi
from tests.conftest import assert_cache_sound, leaves, staging_residue

#: Text that only exists in files outside every declared root.
SECRET_TOKEN = "s3cr3t-0ut5ide-7f3a"
SECRET_HEADER = f"#define SECRET 1234\n/* {SECRET_TOKEN} */\n"

needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="this kernel offers no Landlock")

#: Everything but the real compile (``-MD -MF …``) goes to the real compiler: the
#: Runtime's probes (``--version``, ``-E -v``, ``-print-prog-name``) and the build
#: of the sandbox shim, which uses ``Config.host_cc`` too. The body runs on the real compile.
_PASS_THROUGH = 'case "$*" in *"-MD -MF"*) ;; *) exec /usr/bin/cc "$@";; esac\n'


def write_wrapper(root: Path, body: str, *, name: str = "cc-wrapper", shell: str = "/bin/sh") -> Path:
    """An executable compiler wrapper inside ``root`` (a declared source root)."""
    path = root / name
    path.write_text(f"#!{shell}\n{_PASS_THROUGH}{body}\n")
    path.chmod(0o755)
    return path


def write_failing_wrapper(root: Path, when: str, *, name: str) -> Path:
    """A compiler wrapper (see :func:`write_wrapper`) that fails whenever its arguments
    hold ``when``: a toolchain whose probe finds a feature missing."""
    cc = write_wrapper(root, 'exec /usr/bin/cc "$@"', name=name)
    cc.write_text(cc.read_text().replace("case", f'case "$*" in *"{when}"*) exit 1;; esac\ncase', 1))
    return cc


def staging_entries(cache_dir: Path) -> list[str]:
    """What is left under ``<cache>/v1/tmp`` (staging and compile work dirs), unused spares aside."""
    return staging_residue(cache_dir)


def assert_nothing_published(cache_dir: Path) -> None:
    """No leaf, no leftover staging dir, and a cache that checks clean."""
    assert leaves(cache_dir) == []
    assert staging_entries(cache_dir) == []
    assert_cache_sound(cache_dir)


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET_TOKEN not in str(text)
        assert "SECRET 1234" not in str(text)
