"""A verified remote hit over a paced link: what hashing the artifact as it is received
saves when its bytes take time to arrive (on loopback they have all arrived by the time
the closure is checked, and it saves nothing).

A proxy process between the client and Valkey passes the server's replies on at ``--rate``
bytes/s, 64 KiB at a time (requests unpaced). The same 1 MB hit (``remote_tiers.tier_hit``)
is measured with the raw artifact hashed as it is received and, alternating, hashed after it
has all arrived (no hasher made), each against a raw GET through the same proxy.

    python bench/remote_paced.py [--rate 1.25e9] [--rounds 6]

Seen on the 2-core VM (2026-12-02), 10 Gbit/s, three runs: hit 2740 vs 3037, 2862 vs 3268,
2716 vs 2872 us median (as received vs after); hit/raw GET 1.296 vs 1.325 and 1.317 vs 1.302
(the raw GET through the proxy varies as much). The proxy spins to pace, taking a core:
numbers from a machine with cores to spare are steadier.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import remote_tiers

from safejit.cache.remote import redis as redis_store
from tests.remote._servers import free_port, start_valkey


def _pump(src: socket.socket, dst: socket.socket, rate: float | None) -> None:
    try:
        while data := src.recv(65536):
            if rate:
                until = time.perf_counter() + len(data) / rate
                while time.perf_counter() < until:  # (a sleep would overshoot by far more)
                    pass
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _proxy(port: int, target: int, rate: float, ready: Any) -> None:
    server = socket.create_server(("127.0.0.1", port))
    ready.set()
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(client, upstream, None), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client, rate), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1.25e9, help="bytes/s from the server (1.25e9: 10 Gbit/s)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_valkey(Path(tmp) / "valkey")
        port, ready = free_port(), multiprocessing.Event()
        target = int(server.url.rsplit(":", 1)[1].split("/")[0])
        proxy = multiprocessing.Process(target=_proxy, args=(port, target, args.rate, ready), daemon=True)
        proxy.start()
        assert ready.wait(10), "the proxy did not start"
        url, raw = f"redis://127.0.0.1:{port}/0", redis_store.RAW_HEAD
        seen: dict[str, list[tuple[float, float]]] = {"as received": [], "after": []}
        try:
            for _ in range(args.rounds):
                for mode in random.sample(list(seen), 2):
                    redis_store.RAW_HEAD = raw if mode == "as received" else b"\xff"  # (no codec byte is 0xff)
                    got: dict[str, Any] = {}
                    remote_tiers.tier_hit(got, url, True)
                    seen[mode].append((got["remote_hit_1mb_us"], got["remote_hit_1mb_vs_raw_get"]))
        finally:
            redis_store.RAW_HEAD = raw
            proxy.kill()
            server.stop()
    for mode, rows in seen.items():
        print(
            f"{mode:12s} hit {statistics.median(r[0] for r in rows):7.0f} us (median of {len(rows)}), "
            f"hit / raw GET {statistics.median(r[1] for r in rows):.3f}"
        )


if __name__ == "__main__":
    main()
