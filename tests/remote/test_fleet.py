"""One compile per fleet: processes standing for nodes (each its own disk root), one
Valkey. Cold together, exactly one compiles; the lease holder killed mid-compile,
exactly one more does (after its lease expires), and every node gets the kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import safejit
from safejit.cache.remote.store import RemoteError
from safejit.outcomes import Outcome

from .conftest import FLEET_KEY

CHILD = r"""
import json, sys
import safejit
cache, root, key = sys.argv[1], sys.argv[2], sys.argv[3].encode()
cfg = safejit.Config.from_env(cache_dirs=(cache,), source_roots=(root,), backend="fake", signing_key=key)
rt = safejit.Runtime(config=cfg)
mod = rt.compile(safejit.Source('#include "inner.h"\n', "k"), include_dirs=(root + "/include",))
value = mod.kernel("INNER")()
rt._init()[0].remote.uploads.flush()
print(json.dumps({"compiles": rt.stats()["compiles"], "tier": str(mod.artifact.tier), "value": value}))
rt.close()
"""


def _start(tmp_path: Path, project: Path, url: str, n: int, delay: float, ttl: float) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEJIT_")}
    env.update(
        SAFEJIT_REMOTE=url,
        SAFEJIT_REMOTE_LEASE_TTL_S=str(ttl),
        SAFEJIT_FAULTS=f"compiler.spawn=delay:{delay}",
    )
    return [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / f"node-{i}"), str(project), FLEET_KEY.decode()],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def _results(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode == -signal.SIGKILL:
            continue
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_eight_nodes_cold_together_compile_once(tmp_path, project, redis_server):
    procs = _start(tmp_path, project, redis_server.url, 8, delay=1.0, ttl=10)
    results = _results(procs)
    assert [r["value"] for r in results] == [41] * 8
    assert sum(r["compiles"] for r in results) == 1
    assert sorted(r["tier"] for r in results).count("remote") == 7


def test_the_lease_holder_killed_mid_compile_costs_exactly_one_more_compile(tmp_path, project, redis_server):
    admin = redis_server.admin()
    # (A holder stalled past its TTL less a heartbeat loses the lease, and costs a second
    # compile by design: 2 s leaves a loaded 2-core machine 1.3 s of stall.)
    procs = _start(tmp_path, project, redis_server.url, 8, delay=3.0, ttl=2.0)
    try:
        deadline = time.monotonic() + 60
        holder = None
        while time.monotonic() < deadline and holder is None:
            leases = admin.keys("sj:v1:default:fake:lease:*")
            if leases:
                token = admin.get(leases[0])
                holder = int(token.decode().split(":")[1]) if token else None
            time.sleep(0.01)
        assert holder is not None, "no node took the lease"
        os.kill(holder, signal.SIGKILL)  # mid-compile: its compile takes 3 s
        results = _results(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(results) == 7 and [r["value"] for r in results] == [41] * 7
    assert sum(r["compiles"] for r in results) == 1  # the one that took over; the rest got its leaf


def _tier(rt):
    return rt._init()[0].remote


def _hold_uploads(tier, monkeypatch):
    """Hold ``tier``'s uploads at their first send: set ``sending`` when one reaches it,
    let them on when ``go`` is set."""
    sending, go = threading.Event(), threading.Event()
    real_put = tier.store.put_blob

    def held_put(*args, **kwargs):
        sending.set()
        assert go.wait(30)
        return real_put(*args, **kwargs)

    monkeypatch.setattr(tier.store, "put_blob", held_put)
    return sending, go


def _published_then_b(node, project):
    """Node a compiled and uploaded the kernel; node b, which has not looked yet: the
    request, b, and b's remote tier."""
    src, inc = safejit.Source('#include "inner.h"\n', "k"), (str(project / "include"),)
    a = node("a")
    a.compile(src, include_dirs=inc)
    assert a.flush_uploads().done
    b = node("b")
    return (src, inc), b, _tier(b)


def test_a_lease_let_go_between_a_nodes_try_and_its_look_is_a_hit_not_a_compile(node, project, monkeypatch):
    """Node b looked before a's upload (a miss) and tried the lease while a held it; a
    then published and let go. b must look again and use a's leaf, not compile (the
    race cost a fleet of 8 a second compile on a loaded machine)."""
    (src, inc), b, tier = _published_then_b(node, project)
    real_lookup = tier.lookup
    looks: list[str] = []

    def first_look_misses(key, anchors, **kwargs):
        looks.append(key)  # (the first: before a's upload was there)
        return real_lookup(key if len(looks) > 1 else "0" * len(key), anchors, **kwargs)

    monkeypatch.setattr(tier, "lookup", first_look_misses)
    monkeypatch.setattr(tier, "take_lease", lambda key: None)  # (a still held it then)
    assert b.compile(src, include_dirs=inc).kernel("INNER")() == 41
    assert b.stats()["compiles"] == 0 and b.stats()["remote_hits"] == 1


def test_a_wait_on_a_lease_ends_when_the_remote_cannot_be_asked(node, project, monkeypatch):
    """Waiting on another node's lease, the remote goes away: this node compiles at
    once, not after polling a dead remote until the wait's deadline."""
    src, inc = safejit.Source('#include "inner.h"\n', "k"), (str(project / "include"),)
    b = node("b", compile_timeout_s=5, remote_lease_ttl_s=5)
    tier = _tier(b)
    asked: list[str] = []

    def holder(key):
        asked.append(key)
        if len(asked) == 1:
            return "node-a"
        raise RemoteError("refused", "lease_holder", "connection refused")

    monkeypatch.setattr(tier, "take_lease", lambda key: None)
    monkeypatch.setattr(tier.store, "lease_holder", holder)
    assert b.compile(src, include_dirs=inc).kernel("INNER")() == 41
    assert b.stats()["compiles"] == 1
    assert len(asked) == 2  # held, then cannot say: no polling


def test_a_leaf_published_between_a_waiters_look_and_its_ask_is_a_hit_not_a_compile(node, project, monkeypatch):
    """Node b waits on a's lease. a publishes and lets go just after b looked in the index
    and before b asks whether the lease is held: b must use a's leaf, not take the free
    lease and compile again (a fleet of 8 on a loaded machine compiled twice so)."""
    (src, inc), b, tier = _published_then_b(node, project)
    real_lookup, real_take = tier._lookup, tier.take_lease
    asked: list[str] = []  # (a publishes, then lets go, once b has asked once)

    def lookup(key, anchors):
        return real_lookup(key if len(asked) > 1 else "0" * len(key), anchors)

    def holder(key):
        asked.append(key)
        return "node-a" if len(asked) == 1 else None

    monkeypatch.setattr(tier, "_lookup", lookup)
    monkeypatch.setattr(tier.store, "lease_holder", holder)
    monkeypatch.setattr(tier, "take_lease", lambda key: real_take(key) if len(asked) > 1 else None)
    assert b.compile(src, include_dirs=inc).kernel("INNER")() == 41
    assert b.stats()["compiles"] == 0 and b.stats()["remote_hits"] == 1


def test_the_lease_is_kept_until_the_upload_is_there(node, project, monkeypatch):
    """The compiling node keeps renewing its lease while its upload is on the way: a lease
    let lapse between the compile and the upload let a waiter take it and compile the key
    again. Once the leaf is on the remote, the lease is let go."""
    src, inc = safejit.Source('#include "inner.h"\n', "k"), (str(project / "include"),)
    a = node("a", remote_lease_ttl_s=0.3)
    tier = _tier(a)
    sending, go = _hold_uploads(tier, monkeypatch)
    a.compile(src, include_dirs=inc)
    key = a.explain(src, include_dirs=inc).build_key
    assert sending.wait(30)
    time.sleep(0.9)  # three TTLs: a lease not renewed would be gone
    b = _tier(node("b"))
    try:
        assert b.take_lease(key) is None, "the lease lapsed before the upload was there"
    finally:
        go.set()
    assert a.flush_uploads().done
    assert tier.store.lease_holder(key) is None  # let go once the leaf was there
    assert b.take_lease(key) is not None


def test_closing_lets_the_leases_of_uploads_not_sent_go_at_once(node, project, monkeypatch):
    """A node closed while its uploads wait (the remote slow) drops those still queued,
    counted, and lets their leases go: another node compiles them now, not after a TTL.
    The upload under way when it closed is not one of them."""
    rt = node("a", remote_lease_ttl_s=30)
    tier = _tier(rt)
    sending, go = _hold_uploads(tier, monkeypatch)
    inc = (str(project / "include"),)
    first, second = (safejit.Source(f'#include "inner.h"\n#define V{i} 1\n', "k") for i in (1, 2))
    rt.compile(first, include_dirs=inc)
    assert sending.wait(30)  # the first upload is under way, held
    rt.compile(second, include_dirs=inc)
    key = rt.explain(second, include_dirs=inc).build_key
    b = _tier(node("b"))
    assert b.take_lease(key) is None  # (a holds it while its upload waits)
    try:
        tier.close(timeout=0.2)
        assert b.take_lease(key) is not None, "the lease of an upload never sent was kept"
        assert tier.uploads.dropped == 1
        assert [(r.build_key, r.outcome) for r in tier.uploads.drain(0).results] == [(key, Outcome.UPLOAD_DROPPED)]
    finally:
        go.set()


@pytest.mark.parametrize("closes", [1, 2])
def test_a_compile_that_ends_after_its_node_closed_lets_its_lease_go(node, project, closes):
    """A compile that finishes after the node's remote tier was closed (once, or twice as
    Runtime.close() then __exit__ do) offers an upload that is never sent: it is dropped,
    counted, and its lease let go at once. (After two closes it was left queued behind
    the worker's stop, its lease renewed for as long as the process lived.)"""
    rt = node("a", remote_lease_ttl_s=30)
    tier = _tier(rt)
    inc = (str(project / "include"),)
    rt.compile(safejit.Source('#include "inner.h"\n#define V0 1\n', "k"), include_dirs=inc)
    assert tier.uploads.flush(10)
    for _ in range(closes):
        tier.close(timeout=1.0)
    late = safejit.Source('#include "inner.h"\n#define V1 1\n', "k")
    rt.compile(late, include_dirs=inc)
    key = rt.explain(late, include_dirs=inc).build_key
    assert _tier(node("b")).take_lease(key) is not None, "the lease of the upload never sent was kept"
    results = tier.uploads.drain(0).results
    assert [(r.build_key, r.outcome, r.detail) for r in results][-1:] == [
        (key, Outcome.UPLOAD_DROPPED, "the node was closed")
    ]
    assert tier.uploads.dropped == 1


def test_a_compile_its_node_closes_under_lets_its_lease_go(node, project, monkeypatch):
    """The node closes while a compile that holds the build key's lease runs: when it ends,
    its upload is dropped and its lease let go through the closed store (a connection made
    for that alone), so another node takes the key at once, not after the TTL."""
    rt = node("a", remote_lease_ttl_s=30)
    tier, other = _tier(rt), _tier(node("b"))
    backend = rt._init()[0].backend
    real = backend.compile
    held: list[str | None] = []
    src, inc = safejit.Source('#include "inner.h"\n#define V2 1\n', "k"), (str(project / "include"),)
    key = rt.explain(src, include_dirs=inc).build_key

    def closing(ctx):
        held.append(other.store.lease_holder(key))  # (the lease, taken before the compile)
        tier.close(timeout=1.0)
        return real(ctx)

    monkeypatch.setattr(backend, "compile", closing)
    rt.compile(src, include_dirs=inc)
    assert len(held) == 1 and held[0] is not None, "the compile held no lease"
    assert other.take_lease(key) is not None, "the lease was kept past the node's close"
    assert tier.uploads.dropped == 1 and tier.store._pools == {}


def test_a_read_only_node_compiles_once_the_lease_is_let_go_with_nothing_published(node, project, monkeypatch):
    """A read-only node takes no lease, so it waited for one until its deadline (compile
    timeout + lease TTL: 330 s by default) whenever the holder let go without publishing
    a leaf it could use (its compile failed, its upload was dropped)."""
    src, inc = safejit.Source('#include "inner.h"\n', "k"), (str(project / "include"),)
    b = node("b", remote_mode="read-only", compile_timeout_s=300, remote_lease_ttl_s=60)
    tier = _tier(b)
    asked: list[str] = []

    def holder(key):
        asked.append(key)
        return "node-a" if len(asked) == 1 else None  # held at first, then let go

    monkeypatch.setattr(tier.store, "lease_holder", holder)
    done = threading.Event()
    threading.Thread(target=lambda: (b.compile(src, include_dirs=inc), done.set()), daemon=True).start()
    assert done.wait(60), "still waiting on a lease that was let go"
    assert b.stats()["compiles"] == 1 and len(asked) == 2


def test_uploads_waiting_are_bounded_by_bytes_too(node, project, monkeypatch):
    """32 uploads of up to 512 MiB each could wait in memory at once: what waits is
    bounded by bytes as well (one upload of any size is taken when none waits)."""
    from safejit.cache.remote import uploads as uploads_module

    rt = node("a", remote_lease_ttl_s=30)
    tier = _tier(rt)
    sending, go = _hold_uploads(tier, monkeypatch)
    inc = (str(project / "include"),)
    first, second, third = (safejit.Source(f'#include "inner.h"\n#define V{i} 1\n', "k") for i in (1, 2, 3))
    rt.compile(first, include_dirs=inc)
    assert sending.wait(30)  # the first is under way (still counted until sent)
    size = tier.uploads._queued_bytes
    assert size > 0
    monkeypatch.setattr(uploads_module, "UPLOAD_QUEUE_BYTES", 2 * size + size // 2)
    try:
        rt.compile(second, include_dirs=inc)  # room for it
        rt.compile(third, include_dirs=inc)  # no room: dropped, counted
        assert tier.uploads.dropped == 1
        dropped = [r for r in tier.uploads._results if r.outcome is Outcome.UPLOAD_DROPPED]
        assert len(dropped) == 1 and "bytes" in dropped[0].detail
    finally:
        go.set()
    assert rt.flush_uploads().done and tier.uploads._queued_bytes == 0
