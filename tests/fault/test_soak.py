"""Soak: a long-running process compiles while another edits headers.

The memory tier must stay within its bounds, and no kernel may be older than
``max_staleness_s``: each kernel returns the version of the header it was
built from, and every call is checked against the editor's timeline.

Work is bounded by count *and* time: a run makes its calls, or stops once its time is
up and it has seen what it is there to see (edits, stale entries, evictions); the
assertions are on outcomes only, never on how many calls fitted in the time. The
default run soaks the fake backend (the data path without a compiler: thousands of
calls in seconds) and, briefly, the host compiler (whose early closure scans race
the edits); ``pytest -m slow`` runs 100,000 calls over 200 specs.
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
    tmp_path: Path,
    *,
    calls: int,
    seconds: float,
    specs: int,
    headers: int,
    entries: int,
    staleness: float,
    period: float,
    backend: str = "fake",
) -> None:
    """After ``calls`` calls or ``seconds``, whichever comes first, stop as soon as the run
    has seen four edits, a stale entry and an eviction (and after ``4 * seconds`` in any
    case): a run whose calls all fit before the editor's first edits goes on calling."""
    root = tmp_path / "proj"
    (root / "include").mkdir(parents=True)
    for j in range(headers):
        (root / "include" / f"h{j}.h").write_text("#define VERSION 1\n")
    (root / "timeline.jsonl").write_text("")
    time.sleep(2.1)  # start from non-racy files, as real headers are
    rt = safejit.Runtime(
        config=safejit.Config(
            backend=backend,
            cache_dirs=(str(tmp_path / "cache"),),
            source_roots=(str(root),),
            max_staleness_s=staleness,
            memory_max_entries=entries,
            memory_max_bytes=entries * 20_000,
        )
    )
    if backend == "fake":  # (its kernels are the macros it met: VERSION is the header's)
        text = '#include "h{h}.h"\n#define SPEC {i}\n'
    else:
        text = '#include "h{h}.h"\nint VERSION_OF(void) {{ return VERSION; }}\nint SPEC(void) {{ return {i}; }}\n'
    sources = [(safejit.Source(text.format(h=i % headers, i=i), "k"), i % headers) for i in range(specs)]
    version_kernel = "VERSION" if backend == "fake" else "VERSION_OF"
    stop = tmp_path / "stop"
    editor = subprocess.Popen([sys.executable, "-c", EDITOR, str(root), str(headers), str(period), str(stop)])
    observations = []
    rng = random.Random(7)
    hot = max(1, entries // 2)
    timeline_path = root / "timeline.jsonl"
    soft_deadline = time.monotonic() + seconds
    hard_deadline = time.monotonic() + 4 * seconds

    def seen_enough() -> bool:
        stats = rt.stats()
        edits = timeline_path.read_text().count("\n")
        return edits > 3 and stats["stale"] > 0 and stats["evictions"] > 0

    try:
        n = 0
        while True:
            # Most calls go to a few hot specs (their entries live long enough to go stale
            # and be revalidated), the rest to many cold ones (evictions, disk hits).
            src, header = sources[rng.randrange(hot) if rng.random() < 0.8 else rng.randrange(specs)]
            started = time.time()
            version = rt.compile(src, include_dirs=(str(root / "include"),)).kernel(version_kernel)()
            observations.append((started, header, version))
            n += 1
            if n % 97 == 0 or n >= calls:
                stats = rt.stats()
                assert stats["memory_entries"] <= entries
                assert stats["memory_bytes"] <= entries * 20_000
                now = time.monotonic()
                if now > hard_deadline or ((n >= calls or now > soft_deadline) and seen_enough()):
                    break
    finally:
        stop.touch()
        editor.wait(timeout=30)
    timeline: dict[int, list[tuple[float, int]]] = {}
    for line in timeline_path.read_text().splitlines():
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
    _soak(tmp_path, calls=3000, seconds=6, specs=40, headers=8, entries=16, staleness=0.2, period=0.05)


def test_soak_short_with_the_host_compiler_while_headers_change(tmp_path):
    _soak(tmp_path, calls=300, seconds=20, specs=16, headers=4, entries=8, staleness=0.2, period=0.25, backend="host")


@pytest.mark.slow
def test_soak_100k_calls_over_200_specs(tmp_path):
    _soak(
        tmp_path,
        calls=100_000,
        seconds=1800,
        specs=200,
        headers=20,
        entries=64,
        staleness=1.0,
        period=0.5,
        backend="host",
    )
