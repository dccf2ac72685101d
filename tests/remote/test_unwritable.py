"""A server that is up but takes no writes — full (``maxmemory`` under ``noeviction``) or
a read-only replica — on real servers: every upload fails as ``unwritable``, the breaker
stays closed, and the node keeps its remote hits (a full cache is a read cache, not a
dead one). Nothing is published there meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

import safejit
from safejit.cache.remote.s3 import classify as s3_classify
from safejit.outcomes import Outcome

from ._servers import start_valkey
from .conftest import FLEET_KEY

SRC = safejit.Source('#include "inner.h"\n#define VALUE 7\n', "k")


@pytest.fixture
def primary(tmp_path):
    server = start_valkey(tmp_path / "primary", "--maxmemory-policy", "noeviction")
    yield server
    server.stop()


def _runtime(tmp_path: Path, project: Path, name: str, url: str) -> safejit.Runtime:
    return safejit.Runtime(
        config=safejit.Config(
            backend="fake",
            remote=url,
            signing_key=FLEET_KEY,
            source_roots=(str(project),),
            cache_dirs=(str(tmp_path / f"disk-{name}"),),
        )
    )


def _uploaded_leaf(tmp_path: Path, project: Path, url: str) -> None:
    rt = _runtime(tmp_path, project, "a", url)
    rt.compile(SRC, include_dirs=(str(project / "include"),))
    (done,) = rt.flush_uploads(10).results
    assert done.outcome is Outcome.UPLOADED
    rt.close()


def _refused_uploads_then_a_hit(tmp_path: Path, project: Path, url: str, keys_before: int, admin) -> None:
    rt = _runtime(tmp_path, project, "b", url)
    try:
        for i in range(8):  # leases and uploads: well past the breaker's 10 calls, all refused
            rt.compile(
                safejit.Source(f'#include "inner.h"\n#define OTHER {i}\n', "k"),
                include_dirs=(str(project / "include"),),
            )
        results = rt.flush_uploads(10).results
        assert [r.outcome for r in results] == [Outcome.UPLOAD_FAILED] * 8
        assert all("unwritable" in r.detail for r in results), results[0].detail
        remote = rt._init()[0].remote
        assert remote is not None and remote.store.breaker.state == "closed"
        # The leaf the server had before it filled: still a remote hit here.
        before = rt.stats().get("remote_hits", 0)
        rt.compile(SRC, include_dirs=(str(project / "include"),))
        assert rt.stats()["remote_hits"] == before + 1
        assert rt.stats()["compiles"] == 8
    finally:
        rt.close()
    assert admin.dbsize() == keys_before  # nothing was written while it took no writes


def test_a_full_server_fails_uploads_as_unwritable_and_keeps_serving_hits(tmp_path, project, primary):
    _uploaded_leaf(tmp_path, project, primary.url)
    admin = primary.admin()
    admin.config_set("maxmemory", 1)  # (any write is now over it)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("probe", b"x")
    _refused_uploads_then_a_hit(tmp_path, project, primary.url, admin.dbsize(), admin)


def test_a_read_only_replica_fails_uploads_as_unwritable_and_keeps_serving_hits(tmp_path, project, primary):
    _uploaded_leaf(tmp_path, project, primary.url)
    replica = start_valkey(tmp_path / "replica", "--replicaof", "127.0.0.1", str(primary.port))
    try:
        admin = replica.admin()
        deadline = time.monotonic() + 20
        while admin.dbsize() != primary.admin().dbsize() or admin.info("replication")["master_link_status"] != "up":
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.05)
        _refused_uploads_then_a_hit(tmp_path, project, replica.url, admin.dbsize(), admin)
    finally:
        replica.stop()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Generic S3 error: ... 507 Insufficient Storage ...", "unwritable"),
        ("<Code>XMinioStorageFull</Code>", "unwritable"),
        ("Generic S3 error: ... 500 Internal Server Error ...", "error"),
    ],
)
def test_s3_full_store_is_unwritable(text, reason):
    assert s3_classify(Exception(text)) == reason


def test_a_waiter_on_a_full_server_compiles_once_the_lease_is_free(primary):
    """The lease let go, a waiter could not take it (SET NX refused: the server is full),
    took that for another waiter having it, and watched on until its deadline
    (compile_timeout_s + lease TTL: minutes) with nothing coming."""
    from safejit.cache.remote import RemoteSettings, open_store
    from safejit.cache.remote.tier import RemoteTier

    def tier() -> RemoteTier:
        store = open_store(RemoteSettings.from_url(primary.url, lease_ttl_s=30.0), tenant="t1", backend="fake")
        return RemoteTier(store, writable=True, verifier=None, memo=None, max_artifact_bytes=1 << 20, attrs={})

    a, b = tier(), tier()
    try:
        key = "ab" * 32
        lease = a.take_lease(key)
        assert lease is not None and a.store.renew_lease(lease)  # (the functions loaded, before it is full)
        primary.admin().config_set("maxmemory", 1)
        releaser = threading.Timer(0.3, a.store.release_lease, (lease,))
        releaser.start()
        started = time.monotonic()
        assert b.claim(key, None, deadline=started + 60) is None  # type: ignore[arg-type]
        releaser.join()
        assert time.monotonic() - started < 30  # (not its deadline)
        assert b.store.breaker.state == "closed"
    finally:
        a.close()
        b.close()


def test_a_server_whose_snapshots_fail_still_answers_the_read_only_cli(tmp_path, monkeypatch):
    """Valkey answers PING with MISCONF while its snapshots fail (writes refused, reads
    answered): ``safejit remote stats`` took that for a server down and exited 2."""
    from .test_cli_remote import cli

    server = start_valkey(tmp_path / "misconf", "--save", "3600 1", "--dir", "/proc")  # (no snapshot can be made)
    try:
        admin = server.admin()
        admin.bgsave()
        deadline = time.monotonic() + 20
        while admin.info("persistence")["rdb_last_bgsave_status"] != "err":
            assert time.monotonic() < deadline, "the snapshot did not fail"
            time.sleep(0.05)
        with pytest.raises(redis.exceptions.ResponseError, match="MISCONF"):
            admin.ping()
        monkeypatch.setenv("SAFEJIT_BACKEND", "fake")
        ran = cli("remote", "stats", "--remote", server.url, "--tenant", "t1")
        assert ran.rc == 0, ran.err
    finally:
        server.stop()


def test_a_moments_failure_to_take_a_free_lease_keeps_the_waiter_watching(primary):
    """Only a remote that refuses the lease (full, denied) sends a waiter to compile at
    once: one timed-out SET NX had it compile beside the holder (two compiles a fleet)."""
    from safejit.cache.remote import RemoteError, RemoteSettings, open_store
    from safejit.cache.remote.tier import RemoteTier

    store = open_store(RemoteSettings.from_url(primary.url), tenant="t1", backend="fake")
    tier = RemoteTier(store, writable=True, verifier=None, memo=None, max_artifact_bytes=1 << 20, attrs={})
    answers = [RemoteError("timeout", "lease"), "the lease"]
    try:
        got = tier.wait("cd" * 32, None, deadline=time.monotonic() + 60, take=lambda: answers.pop(0))  # type: ignore[arg-type]
        assert got == "the lease" and answers == []
    finally:
        tier.close()
