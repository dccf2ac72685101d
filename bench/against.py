"""Keys of bench/cache_tiers.py for this tree against another checkout of safejit,
the two taking turns round by round: each side's own bench functions, in a fresh
process with that side's tree first on the import path (what "no worse on any key"
is checked with: one machine, one time, the same functions).

    git worktree add /tmp/old 4625eb4
    python bench/against.py /tmp/old [/tmp/other ...] [--rounds 3] [--json OUT]

Issue 18's "before and after" (2026-12-02, 4 rounds): 4625eb4 (before the restructuring),
943be1d (the restructuring; its bench imports ``spares``, renamed ``staging`` there: patch
that one line in the worktree) and this tree.

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
    parser.add_argument("others", nargs="+", help="other checkouts of safejit (worktrees), compared in this order")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    trees: dict[str, Path] = {}
    for other in (Path(o).resolve() for o in args.others):
        name = _name(other)
        trees[name if name not in trees else f"{name}#{len(trees)}"] = other
    trees["this"] = HERE
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            rows[name].append(side(tree))
            print(f"round {i + 1} {name:10s}", {k: rows[name][-1].get(k) for k in KEYS}, flush=True)
    print(f"{'key':32s}" + "".join(f" {name:>10s}" for name in trees) + f"  (medians of {args.rounds})")
    result = {}
    for key in KEYS:
        result[key] = {name: statistics.median(r[key] for r in rows[name]) for name in trees}
        print(f"{key:32s}" + "".join(f" {v:10.3f}" for v in result[key].values()))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "medians": result}, indent=1))


def _name(tree: Path) -> str:
    """A tree's label: its commit (abbreviated) when it is a checkout of its own, else its
    directory's name."""
    git = ["git", "-C", str(tree), "rev-parse", "--show-toplevel", "--short", "HEAD"]
    out = subprocess.run(git, check=False, capture_output=True, text=True).stdout.split()
    return out[1] if len(out) == 2 and Path(out[0]).resolve() == tree else tree.name


if __name__ == "__main__":
    main()
