"""Soak: a long-running process compiles while another edits headers.

The memory tier must stay within its bounds, and no kernel may be older than
``max_staleness_s``: each kernel returns the version of the header it was
built from, and every call is checked against the editor's timeline.

The short variant runs in CI; ``pytest -m slow`` runs 100,000 calls over 200 specs.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import safejit

EDITOR = r"""
import json, os, sys, time
root, n_headers, period, stop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
version = 1
log = open(os.path.join(root, "timeline.jsonl"), "a", buffering=1)
while not os.path.exists(stop):
    version += 1
    j = version % n_headers
    path = os.path.join(root, "include", f"h{j}.h")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"#define VERSION {version}\n")
    # The edit is "current" from the moment the rename lands.
    os.replace(tmp, path)
    log.write(json.dumps({"h": j, "v": version, "t": time.time()}) + "\n")
    time.sleep(period)
"""


def _soak(
    tmp_path: Path, *, calls: int, specs: int, headers: int, entries: int, staleness: float, period: float
) -> None:
    root = tmp_path / "proj"
    (root / "include").mkdir(parents=True)
    for j in range(headers):
        (root / "include" / f"h{j}.h").write_text("#define VERSION 1\n")
    (root / "timeline.jsonl").write_text("")
    time.sleep(2.1)  # start from non-racy files, as real headers are
    rt = safejit.Runtime(
        config=safejit.Config(
            cache_dirs=(str(tmp_path / "cache"),),
            source_roots=(str(root),),
            max_staleness_s=staleness,
            memory_max_entries=entries,
            memory_max_bytes=entries * 20_000,
        )
    )
    sources = [
        (
            safejit.Source(f'#include "h{i % headers}.h"\nint k(void) {{ return VERSION * 1000 + {i}; }}\n', "k"),
            i % headers,
        )
        for i in range(specs)
    ]
    stop = tmp_path / "stop"
    editor = subprocess.Popen([sys.executable, "-c", EDITOR, str(root), str(headers), str(period), str(stop)])
    observations = []
    rng = random.Random(7)
    try:
        for n in range(calls):
            src, header = sources[rng.randrange(specs)]
            started = time.time()
            value = rt.compile(src, include_dirs=(str(root / "include"),)).kernel("k")()
            observations.append((started, header, value // 1000))
            if n % 97 == 0:
                stats = rt.stats()
                assert stats["memory_entries"] <= entries
                assert stats["memory_bytes"] <= entries * 20_000
    finally:
        stop.touch()
        editor.wait(timeout=30)
    timeline: dict[int, list[tuple[float, int]]] = {}
    for line in (root / "timeline.jsonl").read_text().splitlines():
        rec = json.loads(line)
        timeline.setdefault(rec["h"], []).append((rec["t"], rec["v"]))
    slack = 0.05  # the editor logs its timestamp just after the rename
    stale = []
    for started, header, version in observations:
        # Every version written at least max_staleness_s (+ slack) before the call must be seen.
        due = [v for t, v in timeline.get(header, []) if t < started - staleness - slack]
        if due and version < max(due):
            stale.append((started, header, version, max(due)))
    stats = rt.stats()
    rt.close()
    assert stale == [], f"{len(stale)} stale kernels, e.g. {stale[:3]}"
    assert sum(len(v) for v in timeline.values()) > 3  # the editor really edited
    assert stats["stale"] > 0 and stats["evictions"] > 0


def test_soak_short_compiles_while_headers_change(tmp_path):
    _soak(tmp_path, calls=3000, specs=40, headers=8, entries=16, staleness=0.2, period=0.25)


@pytest.mark.slow
def test_soak_100k_calls_over_200_specs(tmp_path):
    _soak(tmp_path, calls=100_000, specs=200, headers=20, entries=64, staleness=1.0, period=0.5)
