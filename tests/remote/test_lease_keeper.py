"""LeaseKeeper: the heartbeat that keeps a build lease while its holder compiles, on both
engines: it outlives its TTL, is released at the end, and reports a lease it lost."""

from __future__ import annotations

import threading
import time

from safejit import faults
from safejit.cache.remote.lease import LeaseKeeper

from .conftest import hexkey

K = hexkey("lease")


def test_kept_lease_outlives_its_ttl_and_is_released_at_the_end(engine_url, make_store):
    holder, other = make_store(engine_url), make_store(engine_url)
    lease = holder.acquire_lease(K, holder="a", ttl_s=0.4)
    assert lease is not None
    with LeaseKeeper(holder, lease) as keeper:
        time.sleep(1.0)
        assert other.acquire_lease(K, holder="b") is None
        assert other.lease_holder(K) == lease.token
    assert keeper.lost is False
    assert other.lease_holder(K) is None
    assert other.acquire_lease(K, holder="b") is not None


def test_lease_taken_over_after_expiry_is_reported_lost(engine_url, make_store):
    holder, other = make_store(engine_url), make_store(engine_url)
    lease = holder.acquire_lease(K, ttl_s=0.3)
    assert lease is not None
    lost = threading.Event()
    keeper = LeaseKeeper(holder, lease, interval_s=0.6, on_lost=lost.set).start()  # renews too late
    time.sleep(0.4)
    taker = other.acquire_lease(K, ttl_s=30)
    assert taker is not None
    assert lost.wait(5)
    assert keeper.lost
    keeper.stop()
    assert other.lease_holder(K) == taker.token  # stop() did not release someone else's lease


def test_remote_failing_for_a_whole_ttl_loses_the_lease(engine_url, make_store):
    holder = make_store(engine_url)
    lease = holder.acquire_lease(K, ttl_s=0.3)
    assert lease is not None
    lost = threading.Event()
    with faults.inject("remote.lease", "raise:ETIMEDOUT"):
        keeper = LeaseKeeper(holder, lease, interval_s=0.05, on_lost=lost.set).start()
        assert lost.wait(5)
    keeper.stop()
    assert keeper.lost


def test_a_failed_renewal_within_the_ttl_is_retried(engine_url, make_store):
    holder, other = make_store(engine_url), make_store(engine_url)
    lease = holder.acquire_lease(K, ttl_s=1.0)
    assert lease is not None
    with LeaseKeeper(holder, lease, interval_s=0.05) as keeper:
        with faults.inject("remote.lease", "raise:ETIMEDOUT"):
            time.sleep(0.3)  # several renewals fail, all within the TTL
        time.sleep(0.2)
        assert keeper.lost is False
        assert other.lease_holder(K) == lease.token


def test_a_renewal_or_release_raising_anything_else_neither_ends_the_heartbeat_silently_nor_escapes(
    engine_url, make_store, monkeypatch
):
    """Only RemoteError was caught: anything else a renewal raised ended the heartbeat
    thread unseen (the lease then lapsed while its holder still compiled), and a release
    raising escaped stop(), in the upload worker or at close."""
    holder = make_store(engine_url)
    lease = holder.acquire_lease(K, ttl_s=0.3)
    assert lease is not None

    def broken(*args, **kwargs):
        raise ValueError("not a remote failure")

    monkeypatch.setattr(type(holder), "renew_lease", broken)
    monkeypatch.setattr(type(holder), "release_lease", broken)
    lost = threading.Event()
    keeper = LeaseKeeper(holder, lease, interval_s=0.05, on_lost=lost.set).start()
    assert lost.wait(5) and keeper.lost  # (renewals failed for a whole TTL: lost, said so)
    keeper.stop()
    fresh = holder.acquire_lease(hexkey("other"), ttl_s=30)
    assert fresh is not None
    LeaseKeeper(holder, fresh).stop()  # (a release that raises: logged, never raised)
