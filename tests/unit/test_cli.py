"""The command line, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import safejit
from tests.conftest import leaves


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "safejit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=300,
    )


def test_demo_runs_on_a_fresh_home(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": ""}
    out = _cli("demo", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cold compile" in out.stdout and "memory hit" in out.stdout and "fresh process" in out.stdout
    assert "(disk hit, verified; compiles there: 0)" in out.stdout
    assert str(tmp_path / "home" / ".cache" / "safejit") in out.stdout
    assert leaves(tmp_path / "home" / ".cache" / "safejit") == []  # the demo cleans up after itself


def test_ls_stats_and_verify(cache_dir):
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(cache_dir),)))
    art = rt.build(safejit.Source("int one(void) { return 1; }", "one"))
    rt.close()
    ls = _cli("ls", "--cache-dir", str(cache_dir))
    assert ls.returncode == 0 and art.build_key[:16] in ls.stdout and "1 leaves" in ls.stdout
    stats = _cli("stats", "--cache-dir", str(cache_dir))
    assert stats.returncode == 0 and "default" in stats.stdout
    ok = _cli("verify", "--cache-dir", str(cache_dir))
    assert ok.returncode == 0 and "1/1 leaves verify" in ok.stdout
    artifact = Path(art.path) / "artifact.so"
    data = artifact.read_bytes()
    artifact.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    bad = _cli("verify", "--cache-dir", str(cache_dir))
    assert bad.returncode == 1 and "artifact" in bad.stdout and "0/1 leaves verify" in bad.stdout
    fixed = _cli("verify", "--fix", "--cache-dir", str(cache_dir))
    assert fixed.returncode == 1 and "quarantined" in fixed.stdout
    assert _cli("verify", "--cache-dir", str(cache_dir)).returncode == 0  # nothing left to fail
