"""rich is the ``cli`` extra: ``import safejit`` never imports it, and every command works
without it (plain aligned text, a plain status line on a terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

import safejit
from tests.conftest import leaves

#: Runs ``safejit ARGS`` with rich made unimportable (``import rich`` raises ImportError).
NO_RICH = "import sys; sys.modules['rich'] = None; from safejit.cli import main; raise SystemExit(main(sys.argv[1:]))"
WITH_RICH = "import sys; from safejit.cli import main; raise SystemExit(main(sys.argv[1:]))"


def _run(code: str, *args: str, tty: bool = False, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``code`` with ``args``; its output (stdout and stderr together), read from a
    pseudo-terminal when ``tty``."""
    full_env = {**os.environ, "COLUMNS": "80", **(env or {})}
    argv = [sys.executable, "-c", code, *args]
    if not tty:
        done = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=300)
        return done.returncode, done.stdout + done.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=full_env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 300)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def test_import_safejit_and_its_cli_never_import_rich():
    code = (
        "import sys, safejit, safejit.cli, safejit.cli._out;"
        "print(sorted(m for m in sys.modules if m.startswith('rich')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]"
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import safejit"], capture_output=True, text=True, timeout=120
    )
    assert " rich" not in timed.stderr and "| rich" not in timed.stderr


def test_the_package_does_not_require_rich():
    from importlib.metadata import requires

    core = [r for r in requires("safejit") or [] if "extra ==" not in r]
    assert not any(r.startswith("rich") for r in core)
    assert any(r.startswith("rich") and 'extra == "cli"' in r for r in requires("safejit") or [])
    assert any(r.startswith("safejit[cli]") and 'extra == "test"' in r for r in requires("safejit") or [])


@pytest.fixture
def filled(cache_dir: Path) -> Path:
    rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache_dir),)))
    rt.build(safejit.Source("#define VALUE 7\n", "seven"))
    rt.close()
    return cache_dir


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_every_cache_command_works_without_rich(filled, tty):
    (info,) = leaves(filled)
    c = ("--cache-dir", str(filled))
    for args, says in (
        (("ls", *c), "seven"),
        (("stats", *c), "TENANT"),
        (("verify", *c), "1/1 leaves verify"),
        (("verify", "--json", *c), '"verified": 1'),
        (("inspect", info.id, *c), "seven"),
        (("gc", *c), "STAGING"),
        (("prune", "--max-age", "30d", "--dry-run", *c), "would remove 0"),
    ):
        rc, text = _run(NO_RICH, *args, tty=tty)
        assert rc == 0 and says in text, (args, text)
        assert "Traceback" not in text and "\x1b" not in text  # plain: no colour codes at all
    rc, text = _run(NO_RICH, "--version")
    assert rc == 0 and "rich not installed: plain output" in text


def test_the_demo_works_without_rich_on_a_terminal(tmp_path):
    rc, text = _run(NO_RICH, "demo", "--no-keep", "--cache-dir", str(tmp_path), tty=True, env={"HOME": str(tmp_path)})
    assert rc == 0 and "demo ok" in text and "COUNTER" in text
    assert "\rcompiling the demo kernel" in text or "\rcompiling demo (host" in text  # the plain status line
    assert "\x1b" not in text


def test_with_rich_a_terminal_gets_colour(filled):
    pytest.importorskip("rich")
    rc, text = _run(WITH_RICH, "verify", "--cache-dir", str(filled), tty=True)
    assert rc == 0 and "1/1 leaves verify" in text and "\x1b[" in text
