"""A verified remote hit over a paced link: what hashing the artifact as it is received
saves when its bytes take time to arrive (on loopback they have all arrived by the time
the closure is checked, and it saves nothing).

A proxy process between the client and Valkey (the tests' ``Proxy``, paced) passes the
server's replies on at ``--rate`` bytes/s, as they come (requests unpaced). The same 1 MB
hit (``remote_tiers.tier_hit``) is measured with the raw artifact hashed as it is received
and, alternating, hashed after it has all arrived (no hasher made), each against a raw GET
through the same proxy.

    python bench/remote_paced.py [--rate 1.25e9] [--rounds 6]

Seen on the 2-core VM (2026-12-02), 10 Gbit/s, three runs: hit 2740 vs 3037, 2862 vs 3268,
2716 vs 2872 us median (as received vs after); hit/raw GET 1.296 vs 1.325 and 1.317 vs 1.302
(the raw GET through the proxy varies as much). The proxy spins to pace, taking a core:
numbers from a machine with cores to spare are steadier.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import remote_tiers

from safejit.cache.remote import _pending as pending
from tests.remote._servers import Proxy, start_valkey


def _proxy(target: int, rate: float, port: Any) -> None:
    """A paced :class:`Proxy` in a process of its own (its pacing spins: not in the
    measured process); sends its port, then serves until killed."""
    proxy = Proxy(target, rate=rate)
    port.send(proxy.port)
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1.25e9, help="bytes/s from the server (1.25e9: 10 Gbit/s)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp) / "valkey")
        target = int(server.url.rsplit(":", 1)[1].split("/")[0])
        mine, theirs = multiprocessing.Pipe()
        proxy = multiprocessing.Process(target=_proxy, args=(target, args.rate, theirs), daemon=True)
        proxy.start()
        assert mine.poll(10), "the proxy did not start"
        url, raw = f"redis://127.0.0.1:{mine.recv()}/0", pending.RAW_HEAD
        seen: dict[str, list[tuple[float, float]]] = {"as received": [], "after": []}
        try:
            for _ in range(args.rounds):
                for mode in random.sample(list(seen), 2):
                    pending.RAW_HEAD = raw if mode == "as received" else b"\xff"  # (no codec byte is 0xff)
                    got: dict[str, Any] = {}
                    remote_tiers.tier_hit(got, url, True)
                    seen[mode].append((got["remote_hit_1mb_us"], got["remote_hit_1mb_vs_raw_get"]))
        finally:
            pending.RAW_HEAD = raw
            proxy.kill()
            server.stop()
    for mode, rows in seen.items():
        print(
            f"{mode:12s} hit {statistics.median(r[0] for r in rows):7.0f} us (median of {len(rows)}), "
            f"hit / raw GET {statistics.median(r[1] for r in rows):.3f}"
        )


if __name__ == "__main__":
    main()
