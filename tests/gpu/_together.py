"""Processes started together: each waits for a ``go`` file, then reports one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run_together(script: str, go: Path, *args: str, n: int = 8, timeout: float = 300) -> list[dict[str, Any]]:
    """Start ``n`` interpreters on ``script`` (argv: ``go``, then ``args``), let them
    import and set up (3 s), release them at once by making ``go``, and return each one's
    last stdout line as JSON. A process that fails fails the test with its stderr."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(go), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(n)
    ]
    try:
        time.sleep(3)
        go.touch()
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
