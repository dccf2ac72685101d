"""What each sandbox wall costs a run, measured paired and interleaved.

Variants (each a Sandbox whose shims prepare that much; the shim is started ahead,
as in a real compile, so what is measured is the run's own path):

  off        rlimits and process hygiene only (sandbox="off")
  landlock   + Landlock: the old default (a root caller's compiler runs as root)
  seccomp    + the seccomp filter
  full       + the user and mount namespace with the scratch tmpfs, and a root caller's
             compiler as an unprivileged uid (sandbox="auto" now)

Workloads: ``true`` (/bin/true: the wall's fixed cost) and ``cc`` (a small C file
compiled and linked into a shared object with a depfile, its outputs watched: the
cost on a real cold compile, copying into and out of the scratch included).

    python bench/sandbox_walls.py [--rounds N] [--json OUT]

Prints, per workload and variant, the median time and the median of the paired
difference against ``landlock`` (each run against the ``landlock`` run of its round).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from safejit.cache.staging import settle
from safejit.sandbox.runner import SYSTEM_PATH, Sandbox

VARIANTS = ("off", "landlock", "seccomp", "full")


class _Partial(Sandbox):
    """A sandbox whose shims prepare only some walls."""

    def __init__(self, keep: tuple[str, ...]) -> None:
        super().__init__("auto", cc=shutil.which("cc", path=SYSTEM_PATH))
        self._wanted = keep

    def _ahead_options(self) -> list[str]:
        opts = super()._ahead_options()
        out, i = [], 0
        while i < len(opts):
            flag = opts[i]
            takes = flag in ("-T", "-i", "-u", "-g", "-S")
            wanted = "-S" if flag == "-S" else "-U" if flag in ("-U", "-T", "-i", "-u", "-g") else None
            if flag == "-R" or wanted in self._wanted:
                out += opts[i : i + (2 if takes else 1)]
            i += 2 if takes else 1
        return out


def _sandboxes() -> dict[str, Sandbox]:
    return {
        "off": Sandbox("off", cc=shutil.which("cc", path=SYSTEM_PATH)),
        "landlock": _Partial(()),
        "seccomp": _Partial(("-S",)),
        "full": _Partial(("-S", "-U")),
    }


def _one(sb: Sandbox, work: Path, workload: str, i: int) -> float:
    env = {"PATH": SYSTEM_PATH, "LC_ALL": "C", "TMPDIR": str(work / ".tmp")}
    (work / ".tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
    src = work / "src" / "k.c"
    src.parent.mkdir(mode=0o700, exist_ok=True)
    src.write_text(f"#include <stdint.h>\nint64_t f{i}(int64_t x) {{ return x * {i + 3}; }}\n")
    if workload == "true":
        argv, watch = ["/bin/true"], []
    else:
        out, dep = work / "k.so", work / "k.d"
        argv = ["/usr/bin/cc", "-shared", "-fPIC", "-O2", "-MD", "-MF", str(dep), "-o", str(out), "-x", "c", str(src)]
        watch = [str(dep), str(out)]
    t0 = time.perf_counter()
    result = sb.run(argv, cwd=str(work), env=env, timeout=60, write_roots=[str(work)], watch=watch)
    took = time.perf_counter() - t0
    assert result.returncode == 0, result.log
    return took


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--workloads", default="true,cc")
    parser.add_argument("--json")
    args = parser.parse_args()
    boxes = _sandboxes()
    results: dict[str, Any] = {"walls": {k: (v.describe() if k != "off" else "rlimits") for k, v in boxes.items()}}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as base:  # (where compilers work: Config.scratch="memory")
        for workload in args.workloads.split(","):
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for i in range(args.rounds + 3):
                order = list(VARIANTS)
                random.shuffle(order)
                for variant in order:
                    work = Path(base) / f"{workload}-{variant}-{i}"
                    work.mkdir()
                    took = _one(boxes[variant], work, workload, i)
                    settle()  # (the next shim starts in the background: not while another runs)
                    if i >= 3:  # (warm-up: shim build, page cache)
                        times[variant].append(took)
                    shutil.rmtree(work)
            ref = times["landlock"]
            for variant in VARIANTS:
                med = statistics.median(times[variant]) * 1e3
                diff = statistics.median(a - b for a, b in zip(times[variant], ref, strict=True)) * 1e3
                results[f"{workload}_{variant}_ms"] = round(med, 3)
                results[f"{workload}_{variant}_vs_landlock_ms"] = round(diff, 3)
                print(f"{workload:5s} {variant:9s} {med:8.3f} ms   paired vs landlock {diff:+7.3f} ms")
    for sb in boxes.values():
        sb.close()
    print(json.dumps(results["walls"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    os.nice(0)
    raise SystemExit(main())
