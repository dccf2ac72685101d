"""Per-tenant ACL users on a real Valkey, created with the exact ``ACL SETUSER`` lines of
docs/remote.md: a reader cannot publish, a tenant cannot read another's keys, and the
server's NOPERM is the reason ``denied``, never another exception."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import redis

from safejit.cache.remote import Put, RemoteError
from safejit.cache.remote.redis import FUNCTIONS

from .conftest import hexkey

DOCS = Path(__file__).resolve().parents[2] / "docs" / "remote.md"
K, D, DIGEST = hexkey("k"), hexkey("d"), hexkey("blob")


def doc_acl_lines() -> list[str]:
    lines = [line.strip() for line in DOCS.read_text().splitlines() if line.strip().startswith("ACL SETUSER ")]
    assert len(lines) == 3, lines
    return lines


def create_users(admin, tenant: str, *, load_functions: bool = True) -> None:
    for line in doc_acl_lines():
        line = re.sub(r"\bt1\b", tenant, line)
        for role in ("reader", "writer", "auditor"):
            line = line.replace(f"{role.upper()}-PASSWORD", f"{tenant}-{role}-pw")
        admin.execute_command(*shlex.split(line))
    if load_functions:  # (the admin's step in docs/remote.md: writers may not load them)
        for library in FUNCTIONS:
            admin.function_load(library, replace=True)


@pytest.fixture
def users(redis_server):
    admin = redis_server.admin()
    create_users(admin, "t1")
    create_users(admin, "t2")

    def url(tenant: str, role: str) -> str:
        return f"redis://sj-{tenant}-{role}:{tenant}-{role}-pw@127.0.0.1:{redis_server.port}/0"

    return url


def denied(fn) -> None:
    with pytest.raises(RemoteError) as info:
        fn()
    assert info.value.reason == "denied"


def test_writer_publishes_and_reader_reads_its_tenant(users, make_store):
    writer = make_store(users("t1", "writer"), tenant="t1")
    assert writer.put_blob(DIGEST, b"cubin" * 50_000) is Put.CREATED
    assert writer.put_blob(DIGEST, b"cubin" * 50_000) is Put.EXISTS
    assert writer.publish_manifest(K, D, b"{}") is Put.CREATED
    reader = make_store(users("t1", "reader"), tenant="t1")
    assert dict(reader.index(K)) == {D: b"{}"}
    assert reader.has_blob(DIGEST) is True
    assert reader.get_blob(DIGEST) == b"cubin" * 50_000


def test_writer_takes_renews_and_releases_leases(users, make_store):
    writer = make_store(users("t1", "writer"), tenant="t1")
    lease = writer.acquire_lease(K)
    assert lease is not None
    assert make_store(users("t1", "reader"), tenant="t1").lease_holder(K) == lease.token
    assert writer.renew_lease(lease) is True
    assert writer.release_lease(lease) is True


def test_read_only_user_cannot_publish(users, make_store):
    reader = make_store(users("t1", "reader"), tenant="t1")
    denied(lambda: reader.put_blob(DIGEST, b"small"))
    denied(lambda: reader.put_blob(DIGEST, b"large" * 50_000))  # refused at the write, after the EXISTS check
    denied(lambda: reader.publish_manifest(K, D, b"{}"))
    denied(lambda: reader.acquire_lease(K))
    admin_keys = make_store(users("t1", "writer"), tenant="t1").index(K)
    assert dict(admin_keys) == {}


def test_tenant_cannot_read_another_tenants_keys(users, make_store, redis_server):
    make_store(users("t2", "writer"), tenant="t2").publish_manifest(K, D, b"{}")
    make_store(users("t2", "writer"), tenant="t2").put_blob(DIGEST, b"t2 secret")
    for role in ("reader", "writer"):
        t1_as_t2 = make_store(users("t1", role), tenant="t2")
        denied(lambda s=t1_as_t2: s.index(K))
        denied(lambda s=t1_as_t2: s.get_blob(DIGEST))
        denied(lambda s=t1_as_t2: s.has_blob(DIGEST))


def test_writer_cannot_write_another_tenant(users, make_store, redis_server):
    t1_writer_on_t2 = make_store(users("t1", "writer"), tenant="t2")
    denied(lambda: t1_writer_on_t2.put_blob(DIGEST, b"poison"))
    denied(lambda: t1_writer_on_t2.publish_manifest(K, D, b"{}"))
    denied(lambda: t1_writer_on_t2.acquire_lease(K))
    assert redis_server.admin().keys("sj:v1:t2:*") == []


def test_writer_cannot_delete_artifacts_or_indexes(users, make_store, redis_server):
    writer = make_store(users("t1", "writer"), tenant="t1")
    writer.put_blob(DIGEST, b"x")
    writer.publish_manifest(K, D, b"{}")
    raw = redis.Redis(host="127.0.0.1", port=redis_server.port, username="sj-t1-writer", password="t1-writer-pw")
    with raw:
        for key in (f"sj:v1:t1:cas:{DIGEST}", f"sj:v1:t1:cuda:idx:{K}"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                raw.delete(key)
            with pytest.raises(redis.exceptions.NoPermissionError):
                raw.pexpire(key, 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.hset(f"sj:v1:t1:cuda:idx:{K}", D, b"overwrite")
    assert writer.get_blob(DIGEST) == b"x"
    assert dict(writer.index(K)) == {D: b"{}"}


def test_wrong_password_is_denied(users, make_store, redis_server):
    store = make_store(f"redis://sj-t1-reader:wrong@127.0.0.1:{redis_server.port}/0", tenant="t1")
    denied(lambda: store.index(K))


def test_denials_do_not_open_the_breaker(users, make_store):
    reader = make_store(users("t1", "reader"), tenant="t1")
    for _ in range(20):
        denied(lambda: reader.publish_manifest(K, D, b"{}"))
    assert reader.breaker.state == "closed"  # type: ignore[attr-defined]
    assert dict(reader.index(K)) == {}


def test_reader_over_a_unix_socket(users, make_store, redis_server):
    make_store(users("t1", "writer"), tenant="t1").publish_manifest(K, D, b"{}")
    reader = make_store(f"unix://sj-t1-reader:t1-reader-pw@{redis_server.unix}", tenant="t1")
    assert dict(reader.index(K)) == {D: b"{}"}
    denied(lambda: reader.put_blob(DIGEST, b"x"))


def test_auditor_lists_and_reads_its_tenant_and_writes_nothing(users, make_store, redis_server):
    writer = make_store(users("t1", "writer"), tenant="t1")
    writer.put_blob(DIGEST, b"x")
    writer.publish_manifest(K, D, b"{}")
    writer.acquire_lease(K)
    make_store(users("t2", "writer"), tenant="t2").publish_manifest(hexkey("theirs"), D, b"{}")
    auditor = make_store(users("t1", "auditor"), tenant="t1")
    auditor.ping()
    assert [(s.name, s.size) for s in auditor.scan("index", limit=10)] == [(K, 1)]
    assert [(s.name, s.size) for s in auditor.scan("blob", limit=10)] == [(DIGEST, 2)]
    assert [(s.name, s.size) for s in auditor.scan("lease", limit=10)] == [(K, 1)]
    assert dict(auditor.index(K)) == {D: b"{}"} and auditor.get_blob(DIGEST) == b"x"
    denied(lambda: auditor.put_blob(hexkey("new"), b"y"))
    denied(lambda: auditor.publish_manifest(K, hexkey("d2"), b"{}"))
    denied(lambda: auditor.acquire_lease(hexkey("k2")))
    t1_auditor_on_t2 = make_store(users("t1", "auditor"), tenant="t2")
    denied(lambda: list(t1_auditor_on_t2.scan("index", limit=10)))  # (HLEN of a t2 index)
    denied(lambda: t1_auditor_on_t2.index(hexkey("theirs")))


def test_a_nodes_reader_cannot_list_keys(users, make_store):
    reader = make_store(users("t1", "reader"), tenant="t1")
    for kind in ("index", "blob", "lease"):
        denied(lambda k=kind: list(reader.scan(k, limit=10)))


def test_connecting_sends_nothing_a_least_privilege_user_may_not_run(users, make_store, redis_server):
    """redis-py sends CLIENT SETINFO on connect unless told not to; safejit's connection
    class takes **kwargs only, so the check for how to tell it saw no such parameter: two
    commands per connect, each a NOPERM in the server's ACL LOG for the docs' users."""
    admin = redis_server.admin()
    admin.execute_command("CONFIG", "RESETSTAT")
    admin.execute_command("ACL", "LOG", "RESET")
    reader = make_store(users("t1", "reader"), tenant="t1")
    reader.ping()
    assert not reader.index(K)
    assert "cmdstat_client|setinfo" not in admin.info("commandstats")
    assert admin.acl_log() == []


def test_a_command_a_script_may_not_run_is_denied_not_an_error(redis_server, make_store):
    """A permission refused inside a function comes back without the NOPERM prefix ('ACL
    failure in script'): it was an error, counted by the breaker as the remote failing."""
    admin = redis_server.admin()
    for library in FUNCTIONS:
        admin.function_load(library, replace=True)
    admin.execute_command(
        "ACL", "SETUSER", "sj-t1-nohsetnx", "on", ">pw", "resetkeys", "-@all", "~sj:v1:t1:*",
        "+fcall", "+ping",
    )  # fmt: skip
    store = make_store(f"redis://sj-t1-nohsetnx:pw@127.0.0.1:{redis_server.port}/0", tenant="t1")
    for _ in range(20):
        denied(lambda: store.publish_manifest(K, D, b"{}"))
    assert store.breaker.state == "closed"  # type: ignore[attr-defined]


def test_a_writer_runs_the_safejit_functions_only_never_any_lua(redis_server, make_store, users):
    """A writer allowed EVAL could run a loop that stalls the server for every tenant."""
    writer = make_store(users("t1", "writer"), tenant="t1")
    assert writer.publish_manifest(K, D, b"{}") is Put.CREATED
    as_writer = redis.Redis(port=redis_server.port, username="sj-t1-writer", password="t1-writer-pw")
    for lua in (lambda: as_writer.eval("return 1", 0), lambda: as_writer.function_load(FUNCTIONS[0], replace=True)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            lua()
    as_writer.close()


def test_a_writer_on_a_server_without_the_functions_is_denied_and_told_why(redis_server, make_store):
    admin = redis_server.admin()
    admin.function_flush()
    create_users(admin, "t3", load_functions=False)
    writer = make_store(f"redis://sj-t3-writer:t3-writer-pw@127.0.0.1:{redis_server.port}/0", tenant="t3")
    with pytest.raises(RemoteError) as info:
        writer.publish_manifest(K, D, b"{}")
    assert info.value.reason == "denied" and "FUNCTION LOAD" in str(info.value)
    assert admin.keys("sj:v1:t3:*") == []  # (nothing published)
    for library in FUNCTIONS:
        admin.function_load(library, replace=True)
    assert writer.publish_manifest(K, D, b"{}") is Put.CREATED
