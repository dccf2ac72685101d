"""Keys of bench/cache_tiers.py for this tree against another checkout of safejit,
the two taking turns round by round: each side's own bench functions, in a fresh
process with that side's tree first on the import path (what "no worse on any key"
is checked with: one machine, one time, the same functions).

    git worktree add /tmp/old 4625eb4
    python bench/against.py /tmp/old [--rounds 3] [--json OUT]

Keys: host_memory_hit_p50_us, host_disk_hit_ms, host_disk_hit_1000_headers_ms,
verify_gb_per_s, host_cold_overhead_ratio (31 compiles a round). Prints each round's
values and the medians; lower is better except verify_gb_per_s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

DRIVER = r"""
import contextlib, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("cache_tiers", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
out = {}
with contextlib.redirect_stdout(io.StringIO()):
    bench.memory_hit(out, False)
    bench.disk_hit(out, "host_disk_hit_ms", 1, 15)
    bench.disk_hit(out, "host_disk_hit_1000_headers_ms", 1000, 9)
    bench.verify_throughput(out, False)
    bench.cold_overhead(out, 31)
print(json.dumps(out))
"""
KEYS = (
    "host_memory_hit_p50_us",
    "host_disk_hit_ms",
    "host_disk_hit_1000_headers_ms",
    "verify_gb_per_s",
    "host_cold_overhead_ratio",
)


def side(tree: Path) -> dict[str, float]:
    # (the tree first; what the path held after it: packages installed outside the environment)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tree / "bench" / "cache_tiers.py")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("other", help="another checkout of safejit (a worktree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    trees = {"other": Path(args.other).resolve(), "this": HERE}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            rows[name].append(side(tree))
            print(f"round {i + 1} {name:5s}", {k: rows[name][-1].get(k) for k in KEYS}, flush=True)
    print(f"{'key':32s} {'other':>10s} {'this':>10s}  (medians of {args.rounds})")
    result = {}
    for key in KEYS:
        other, this = (statistics.median(r[key] for r in rows[name]) for name in ("other", "this"))
        result[key] = {"other": other, "this": this}
        print(f"{key:32s} {other:10.3f} {this:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "medians": result}, indent=1))


if __name__ == "__main__":
    main()
