"""The remote tier in the data path, on a real Valkey (and S3 where it matters): a leaf
another node published is used only once it verifies against THIS node's files; every
tampering is a miss with a named reason and nothing is loaded; a read-only node cannot
publish; the remote never raises out of compile()."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import msgspec
import pytest

import safejit
from safejit.cache.leaf import decode_manifest, encode_manifest
from safejit.cache.remote import RemoteError
from safejit.cache.remote.codec import encode as encode_blob
from safejit.closure.hashing import digest_bytes
from safejit.policy.trust import Ed25519Signer

from ._servers import BlackHole
from .test_acl import create_users

SRC = safejit.Source('#include "inner.h"\n#define VALUE 7\n', "k")


def _inc(project: Path) -> tuple[str, ...]:
    return (str(project / "include"),)


def _published(rt: safejit.Runtime, project: Path) -> safejit.Module:
    mod = rt.compile(SRC, include_dirs=_inc(project))
    rt._init()[0].remote.uploads.flush()  # the upload is asynchronous
    return mod


def test_a_leaf_published_by_one_node_is_a_verified_hit_on_another(node, project, tmp_path, engine_url):
    a = node("a", remote=engine_url)
    assert _published(a, project).kernel("INNER")() == 41
    b = node("b", remote=engine_url)
    mod = b.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "remote" and mod.kernel("INNER")() == 41
    assert b.stats()["compiles"] == 0 and b.stats()["remote_hits"] == 1
    safejit.faults.reset()
    from safejit.cache.staging import settle

    settle()  # the disk backfill happens off the hit path
    again = node("b", remote=engine_url)
    assert again.compile(SRC, include_dirs=_inc(project)).artifact.tier == "disk"


def test_the_host_backend_round_trips_a_real_shared_object(node, project):
    src = safejit.Source("int add(int a, int b) { return a + b; }\n", "add")
    a = node("a", backend="host")
    a.compile(src)
    a._init()[0].remote.uploads.flush()
    mod = node("b", backend="host").compile(src)
    assert mod.artifact.tier == "remote" and mod.kernel("add")(2, 3) == 5


def test_a_remote_leaf_is_checked_against_this_nodes_files(node, project, tmp_path):
    """The closure is rehashed here: a node whose header differs compiles its own."""
    _published(node("a"), project)
    (project / "include" / "inner.h").write_text("#define INNER 9\n")
    b = node("b")
    explained = b.compile(SRC, include_dirs=_inc(project))
    assert explained.kernel("INNER")() == 9 and explained.artifact.tier == "compiled"


def test_a_remote_leaf_whose_closure_differs_here_is_never_read(node, project, otel_sdk):
    """Its artifact is asked for while the closure is checked (the bytes travel meanwhile:
    here the build key's head, asked for with the index), but the reply is dropped, never
    hashed, decoded or loaded: no fetch span (in which the bytes are read and hashed)."""
    _published(node("a"), project)
    (project / "include" / "inner.h").write_text("#define INNER 9\n")
    spans, _ = otel_sdk
    spans.clear()
    b = node("b")
    assert b.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"
    names = [s.name for s in spans.get_finished_spans()]
    (lookup,) = [s for s in spans.get_finished_spans() if s.name == "safejit.cache.remote.lookup"]
    assert lookup.attributes["safejit.reason"] == "dep_changed"
    assert "safejit.cache.remote.fetch" not in names, names


# -- the tamper matrix -----------------------------------------------------------------
def _entry(redis_server, tenant: str = "default", backend: str = "fake") -> tuple[str, str, bytes]:
    admin = redis_server.admin()
    (index,) = admin.keys(f"sj:v1:{tenant}:{backend}:idx:*")
    ((deps, raw),) = admin.hgetall(index).items()
    return index.decode(), deps.decode(), raw


def _set_manifest(redis_server, index: str, deps: str, raw: bytes) -> None:
    admin = redis_server.admin()
    admin.delete(index)
    admin.hset(index, deps, raw)


def _rewrite(redis_server, change) -> None:
    index, deps, raw = _entry(redis_server)
    data = json.loads(raw)
    change(data)
    _set_manifest(redis_server, index, deps, json.dumps(data).encode())


def _blob_key(man_raw: bytes) -> str:
    return f"sj:v1:default:cas:{decode_manifest(man_raw).artifact_digest}"


def _copies(redis_server) -> list[str]:
    """Where the artifact is stored: its blob, and the build key's head (the first leaf's)."""
    index, _, raw = _entry(redis_server)
    head = index.replace(":idx:", ":head:")
    stored = redis_server.admin().get(head)  # (the artifact's digest in front of the blob's value)
    assert stored[32:] == redis_server.admin().get(_blob_key(raw))
    assert stored[:32].hex() == decode_manifest(raw).artifact_digest
    return [_blob_key(raw), head]


def flip_blob(redis_server) -> None:
    admin = redis_server.admin()
    for key in _copies(redis_server):
        blob = bytearray(admin.get(key))
        blob[-1] ^= 0xFF
        admin.set(key, bytes(blob))


SWAPPED = encode_blob(b'safejit-fake-1\n{"INNER": "666"}', min_bytes=1 << 30)


def swap_blob(redis_server) -> None:
    admin = redis_server.admin()
    for key in _copies(redis_server):
        admin.set(key, SWAPPED)


def move_to_other_build_key(redis_server) -> None:
    index, deps, raw = _entry(redis_server)
    admin = redis_server.admin()
    admin.delete(index)
    admin.hset(index.rsplit(":", 1)[0] + ":" + "0" * 64, deps, raw)
    # and a manifest naming another build key under this one
    data = json.loads(raw)
    data["build_key"] = "1" * 64
    admin.hset(index, deps, json.dumps(data).encode())


def move_to_other_deps_key(redis_server) -> None:
    index, _, raw = _entry(redis_server)
    _set_manifest(redis_server, index, "2" * 64, raw)


def move_to_other_tenant(redis_server) -> None:
    _rewrite(redis_server, lambda d: d.update(tenant="other"))


def closure_digest_differs(redis_server) -> None:
    _rewrite(redis_server, lambda d: d["deps"][0].__setitem__(2, "3" * 64))


def oversize(redis_server) -> None:
    _rewrite(redis_server, lambda d: d["artifact"].update(size=2**40))


def compression_bomb(redis_server) -> None:
    import zstandard

    admin = redis_server.admin()
    index, deps, raw = _entry(redis_server)
    man = decode_manifest(raw)
    bomb = b"\x01" + zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    digest = digest_bytes(b"\0" * (64 << 20))
    admin.set(f"sj:v1:default:cas:{digest}", bomb)
    forged = msgspec.structs.replace(man, artifact=msgspec.structs.replace(man.artifact, digest=digest, size=1000))
    _set_manifest(redis_server, index, deps, encode_manifest(forged))


def not_json(redis_server) -> None:
    index, deps, _ = _entry(redis_server)
    _set_manifest(redis_server, index, deps, b"{" * 50_000)


TAMPERS = {
    "flipped byte in the blob and the head": (flip_blob, {"artifact"}),
    "blob and head swapped for another": (swap_blob, {"artifact"}),
    "manifest under another build key": (move_to_other_build_key, {"mismatch", "absent"}),
    "manifest under another deps key": (move_to_other_deps_key, {"mismatch"}),
    "manifest of another tenant": (move_to_other_tenant, {"mismatch"}),
    "closure digest that differs from the local file": (closure_digest_differs, {"mismatch", "dep_changed"}),
    # (the manifest rewritten: its signature, checked first, fails)
    "oversize artifact": (oversize, {"oversize", "signature"}),
    "compression bomb": (compression_bomb, {"oversize", "artifact", "signature"}),
    "manifest that is not JSON": (not_json, {"manifest"}),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_remote_leaf_is_a_named_miss_and_nothing_is_loaded(node, project, redis_server, tamper, otel_sdk):
    damage, reasons = TAMPERS[tamper]
    _published(node("a"), project)
    damage(redis_server)
    spans, _ = otel_sdk
    spans.clear()
    b = node("b", max_artifact_bytes=1 << 20)
    mod = b.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "compiled" and mod.kernel("INNER")() == 41  # its own build, not the remote's
    lookups = [s for s in spans.get_finished_spans() if s.name == "safejit.cache.remote.lookup"]
    assert lookups and lookups[0].attributes["safejit.result"] == "miss"
    assert lookups[0].attributes["safejit.reason"] in reasons, lookups[0].attributes


def _bomb() -> bytes:
    import zstandard

    return b"\x01" + zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))


HEAD_TAMPERS = {
    "flipped byte": lambda value: value[:-1] + bytes((value[-1] ^ 0xFF,)),
    "another artifact": lambda value: SWAPPED,
    "over head_max_bytes": lambda value: b"\x00" + b"x" * (2 << 20),
    "a compression bomb": lambda value: _bomb(),
    "a compression bomb under the leaf's digest": lambda value: value[:32] + _bomb(),
    "an unknown codec": lambda value: value[:32] + b"\x07" + value[33:],
    "another leaf's digest in front": lambda value: bytes(32) + value[32:],
    "a value of another type": None,
}


@pytest.mark.parametrize("tamper", list(HEAD_TAMPERS))
def test_a_head_that_is_not_the_leafs_artifact_is_passed_over_for_its_blob(node, project, redis_server, tamper):
    """The head (the artifact read with the index) is used only when its bytes hash as the
    manifest says; anything else there costs the blob's round trip, never a load of it.
    With the blob gone too, the leaf is a miss (its artifact), and the node compiles."""
    _published(node("a"), project)
    admin = redis_server.admin()
    blob, head = _copies(redis_server)
    change = HEAD_TAMPERS[tamper]
    if change is None:
        admin.delete(head)
        admin.hset(head, "x", "y")
    else:
        admin.set(head, change(admin.get(head)))
    b = node("b", max_artifact_bytes=1 << 20)
    mod = b.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "remote" and mod.kernel("INNER")() == 41
    assert b.stats()["remote_hits"] == 1
    admin.delete(blob)
    c = node("c", max_artifact_bytes=1 << 20)
    mod = c.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "compiled" and mod.kernel("INNER")() == 41
    assert c.stats()["remote_hits"] == 0


def test_a_hit_on_the_head_takes_one_round_trip_and_reads_no_blob(node, project, redis_server, monkeypatch):
    """The index and the head go out in one write: a leaf whose artifact is its build key's
    head is a hit with no blob read (the blob may even be gone); with heads off
    (``head_max_bytes=0``) the same hit reads the blob."""
    _published(node("a"), project)
    admin = redis_server.admin()
    blob, _ = _copies(redis_server)
    admin.delete(blob)
    b = node("b")
    sent = _count_sends(b, monkeypatch)
    mod = b.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "remote" and mod.kernel("INNER")() == 41
    assert sent == [1], sent  # (one write: the index and the head's read, pipelined)
    off = node("c", remote_head_max_bytes=0)
    assert off.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"  # (no blob, no head read)


def test_only_the_first_leaf_of_a_build_key_is_its_head(node, project, redis_server, monkeypatch):
    """A second leaf (another closure) keeps its artifact in its blob only; a node whose
    files are the second's gets it from there, the head read and passed over by the digest
    in front of it: never decoded or hashed (one value decoded: the blob)."""
    _published(node("a"), project)
    admin = redis_server.admin()
    _, head = _copies(redis_server)
    first = admin.get(head)
    (project / "include" / "inner.h").write_text("#define INNER 9\n")
    time.sleep(0.05)
    _published(node("b"), project)
    assert admin.get(head) == first and len(admin.hgetall(_entry_key(redis_server))) == 2
    from safejit.cache.remote import codec

    decoded = []
    real = codec.decode_parts
    monkeypatch.setattr(codec, "decode_parts", lambda *a, **k: decoded.append(1) or real(*a, **k))
    c = node("c")
    mod = c.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "remote" and mod.kernel("INNER")() == 9
    assert decoded == [1]


def _entry_key(redis_server) -> str:
    (index,) = redis_server.admin().keys("sj:v1:default:fake:idx:*")
    return index.decode()


class _Counted:
    """A connection's socket that counts its writes (each a round trip's request)."""

    def __init__(self, sock, counts: list[int]) -> None:
        self._sock, self._counts = sock, counts

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def sendall(self, data) -> None:
        self._counts[-1] += 1
        self._sock.sendall(data)


def _count_sends(rt: safejit.Runtime, monkeypatch) -> list[int]:
    """Writes to the server per remote lookup of ``rt`` (filled as it looks)."""
    from safejit.cache.remote._lane import Lane

    tier = rt._init()[0].remote
    counts: list[int] = []
    take, look = Lane.take, tier._look

    def counted_take(lane):
        conn = take(lane)
        if not isinstance(conn._sock, _Counted):
            conn._sock = _Counted(conn._sock, counts)
        return conn

    def counted_look(build_key, anchors):
        counts.append(0)
        return look(build_key, anchors)

    monkeypatch.setattr(Lane, "take", counted_take)
    monkeypatch.setattr(tier, "_look", counted_look)
    return counts


def test_an_unsigned_or_foreign_signed_leaf_is_a_miss_under_verify_keys(node, project, redis_server, tmp_path):
    builder = Ed25519Signer.generate()  # (key ids: derived from the public key, as a PEM carries none)
    other = Ed25519Signer.generate()
    # A leaf signed by a key the reader does not trust:
    _published(node("a", signing_key=other.private_pem()), project)
    reader = node("b", verify_keys=((builder.key_id, builder.public_key),))
    assert reader.explain(SRC, include_dirs=_inc(project)).result == "miss"  # (disk: nothing there)
    mod = reader.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "compiled"
    reader._init()[0].remote.uploads.flush()  # (its own upload: done before the keyspace is emptied)
    # The builder's own leaf is trusted (readers hold the public key only):
    redis_server.admin().flushall()
    _published(node("c", signing_key=builder.private_pem()), project)
    fresh = node("d", verify_keys=((builder.key_id, builder.public_key),))
    assert fresh.compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"


def test_an_unsigned_remote_leaf_is_a_miss_whatever_require_signed_says(node, project, redis_server):
    """A writer of the keyspace without the fleet's key (a leaked ACL password) plants an
    unsigned manifest naming bytes it chose: no node loads them, not even one whose own
    disk takes unsigned leaves (``require_signed=False``); the remote tier checked
    signatures only when the disk's policy did, and with no key configured, never."""
    _published(node("a"), project)
    index, _, raw = _entry(redis_server)
    evil = b'safejit-fake-1\n{"INNER": "666"}'
    redis_server.admin().set(f"sj:v1:default:cas:{digest_bytes(evil)}", encode_blob(evil, min_bytes=1 << 30))
    man = decode_manifest(raw)
    forged = msgspec.structs.replace(
        man,
        signature=None,
        artifact=msgspec.structs.replace(man.artifact, digest=digest_bytes(evil), size=len(evil)),
        created=man.created + 1,
    )
    redis_server.admin().delete(index.replace(":idx:", ":head:"))
    _set_manifest(redis_server, index, man.deps_key, encode_manifest(forged))
    reader = node("b", require_signed=False)
    mod = reader.compile(SRC, include_dirs=_inc(project))
    assert mod.kernel("INNER")() == 41 and mod.artifact.tier == "compiled"
    assert reader.stats()["remote_hits"] == 0


def test_a_rotated_signing_key_publishes_beside_the_old_keys_entry(node, project, redis_server):
    """Entries are write-once per leaf and signer: after the builder's key is rotated, its
    upload of a leaf already there under the old key is a new entry (not "already on the
    remote"), and nodes that hold only the new public key hit it."""
    old, new = Ed25519Signer.generate(), Ed25519Signer.generate()
    trusts = {key: ((key.key_id, key.public_key),) for key in (old, new)}
    _published(node("a", signing_key=old.private_pem(), verify_keys=trusts[old]), project)
    assert node("b", verify_keys=trusts[old]).compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"
    builder = node("c", signing_key=new.private_pem(), verify_keys=trusts[new])
    assert builder.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"  # (the old key's: unknown)
    uploads = builder.flush_uploads()
    assert [(u.outcome.value, u.detail) for u in uploads.results] == [("uploaded", "")], uploads
    index = _entry_key(redis_server)
    fields = sorted(f.decode() for f in redis_server.admin().hkeys(index))
    deps = fields[0][:64]
    # (the old key's under the bare deps key, which readers from before key ids in entry
    # names read too; the new one's beside it, named by its key id)
    assert fields == [deps, f"{deps}.{new.key_id}"]
    mod = node("d", verify_keys=trusts[new]).compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "remote" and mod.kernel("INNER")() == 41
    # An entry must be named by its own manifest's signer: the old key's manifest under the
    # new key's name is no leaf of the new key (nor of the old one, there).
    admin = redis_server.admin()
    raw = admin.hget(index, deps)
    admin.delete(index)
    admin.hset(index, f"{deps}.{new.key_id}", raw)
    misnamed = node("e", verify_keys=trusts[old])
    assert misnamed.explain(SRC, include_dirs=_inc(project)).result == "miss"
    assert misnamed.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"
    # And the new builder's next upload of the same leaf finds its own entry there.
    admin.delete(index)
    admin.hset(index, deps, raw)
    again = node("g", signing_key=new.private_pem(), verify_keys=trusts[new])
    again.compile(SRC, include_dirs=_inc(project))
    assert [(u.outcome.value, u.detail) for u in again.flush_uploads().results] == [("uploaded", "")]
    assert sorted(f.decode() for f in admin.hkeys(index)) == [deps, f"{deps}.{new.key_id}"]
    third = node("h", signing_key=new.private_pem(), verify_keys=trusts[new])
    third.compile(safejit.Source(SRC.code + "\n", "k"), include_dirs=_inc(project))  # (another build key)
    assert node("i", verify_keys=trusts[new]).compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"


def test_a_leaf_a_builder_publishes_is_read_by_readers_from_before_key_ids_in_entry_names(node, project, redis_server):
    """Signed or not, a leaf goes under its bare deps key first: a reader that knows only
    those (an older release, during an upgrade of a fleet) finds it."""
    signer = Ed25519Signer.generate()
    _published(node("a", signing_key=signer.private_pem()), project)
    ((field, raw),) = redis_server.admin().hgetall(_entry_key(redis_server)).items()
    assert len(field) == 64 and decode_manifest(raw).signature.key_id == signer.key_id


def test_a_planted_signature_past_ascii_is_a_miss_not_an_exception_out_of_compile(node, project, redis_server):
    key = b"shared-hmac-key-0123456789abcdef"
    _published(node("a", signing_key=key), project)

    def plant(data: dict) -> None:
        data["signature"] = {"alg": "hmac-sha256", "key_id": "", "value": "\u00e9" * 64}

    _rewrite(redis_server, plant)
    b = node("b", signing_key=key)
    mod = b.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "compiled" and mod.kernel("INNER")() == 41


def test_a_check_that_raises_on_the_remotes_data_is_a_miss_never_raised(node, project, monkeypatch, caplog):
    from safejit.cache.remote import tier as tier_module

    _published(node("a"), project)
    monkeypatch.setattr(tier_module, "compute_deps_key", lambda *a: 1 / 0)  # (any check the data breaks)
    b = node("b")
    assert b.compile(SRC, include_dirs=_inc(project)).artifact.tier == "compiled"
    assert "checking the remote's leaves" in caplog.text


def test_a_lease_command_that_raises_is_a_compile_without_the_lease_never_raised(node, project, monkeypatch, caplog):
    from safejit.cache.remote.redis import RedisStore

    def broken(*args, **kwargs):
        raise ValueError("a check the lease commands make")

    import logging

    monkeypatch.setattr(RedisStore, "acquire_lease", broken)
    monkeypatch.setattr(RedisStore, "lease_holder", broken)
    caplog.set_level(logging.DEBUG, logger="safejit.cache.remote.tier")  # (ERROR the first time per process)
    rt = node("a")
    mod = rt.compile(SRC, include_dirs=_inc(project))
    assert mod.artifact.tier == "compiled" and mod.kernel("INNER")() == 41
    assert rt.stats()["compiles"] == 1
    assert "taking the lease on" in caplog.text


def test_a_negative_header_present_locally_makes_the_remote_leaf_a_miss(node, project, tmp_path):
    first, second = project / "include", project / "second"
    second.mkdir()
    (first / "inner.h").unlink()
    (second / "inner.h").write_text("#define INNER 2\n")
    dirs = (str(first), str(second))
    a = node("a")
    a.compile(SRC, include_dirs=dirs)
    a._init()[0].remote.uploads.flush()
    (first / "inner.h").write_text("#define INNER 1\n")  # shadows the one in `second`, here
    mod = node("b").compile(SRC, include_dirs=dirs)
    assert mod.artifact.tier == "compiled" and mod.kernel("INNER")() == 1


# -- ACLs --------------------------------------------------------------------------------
def test_a_read_only_user_cannot_publish_and_a_tenant_cannot_read_another(node, project, redis_server):
    from safejit.cache.remote import RemoteSettings, open_store

    admin = redis_server.admin()
    create_users(admin, "t1")
    create_users(admin, "t2")

    def url(tenant: str, role: str) -> str:
        return f"redis://sj-{tenant}-{role}:{tenant}-{role}-pw@127.0.0.1:{redis_server.port}/0"

    reader = node("r", tenant="t1", remote=url("t1", "reader"))
    assert reader.compile(SRC, include_dirs=_inc(project)).kernel("INNER")() == 41  # works; its upload is denied
    reader._init()[0].remote.uploads.flush()
    assert admin.keys("sj:v1:t1:*:idx:*") == []
    writer = node("w", tenant="t1", remote=url("t1", "writer"))
    _published(writer, project)
    assert admin.keys("sj:v1:t1:*:idx:*") != []
    assert node("r2", tenant="t1", remote=url("t1", "reader")).compile(
        SRC, include_dirs=_inc(project)
    ).artifact.tier == ("remote")
    # t2's credentials aimed at t1's keys: NOPERM is the reason "denied", never another error.
    (index,) = admin.keys("sj:v1:t1:*:idx:*")
    build_key = index.decode().rsplit(":", 1)[1]
    spy = open_store(RemoteSettings.from_url(url("t2", "writer")), tenant="t1", backend="fake")
    try:
        with pytest.raises(RemoteError) as exc:
            spy.index(build_key)
        assert exc.value.reason == "denied"
    finally:
        spy.close()


# -- the remote never hurts --------------------------------------------------------------
def test_a_remote_that_never_answers_costs_a_bounded_delay_and_no_error(node, project):
    hole = BlackHole()  # accepts, never answers
    try:
        rt = node("a", remote=f"redis://127.0.0.1:{hole.port}/0")
        started = time.monotonic()
        mod = rt.compile(SRC, include_dirs=_inc(project))
        assert mod.kernel("INNER")() == 41
        assert time.monotonic() - started < 10  # (generous: each remote call is bounded by 100 ms-2 s)
        for i in range(12):  # the breaker opens: later compiles do not wait for the remote
            rt.compile(safejit.Source(f"#define V{i} {i}\n", "v"))
        assert rt._init()[0].remote.store.breaker.state == "open"
        before = hole.traffic()
        assert before[0] >= 1 and before[1] > 0  # (the calls before reached it)
        rt.compile(safejit.Source("#define LAST 1\n", "v"))
        rt._init()[0].remote.uploads.flush()
        assert hole.traffic() == before  # no remote call waited for: no connection, no byte
    finally:
        hole.close()


def test_a_remote_that_is_down_never_raises_out_of_compile(node, project):
    rt = node("a", remote="redis://127.0.0.1:1/0")  # nothing listens on port 1
    for i in range(5):
        assert rt.compile(safejit.Source(f"#define V {i}\n", "v")).kernel("V")() == i
    assert rt.stats()["compiles"] == 5


def test_a_resolver_that_does_not_answer_costs_the_connect_deadline_and_opens_the_breaker(node, project, monkeypatch):
    """getaddrinfo has no deadline: a resolver that did not answer held each remote call
    of a compile for its own timeout (5 s an attempt), three calls a compile, and the
    failures, errors rather than timeouts, never opened the breaker."""
    import socket
    import threading

    real = socket.getaddrinfo
    release = threading.Event()
    asked = []

    def stalled(host, *args, **kwargs):
        if host == "cache.stalled.test":
            asked.append(host)
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    try:
        rt = node("a", remote="redis://cache.stalled.test:6379/0")
        started = time.monotonic()
        for i in range(6):
            assert rt.compile(safejit.Source(f"#define V {i}\n", "v")).kernel("V")() == i
        took = time.monotonic() - started
        assert rt._init()[0].remote.store.breaker.state == "open"
        assert len(asked) == 1  # (one resolution under way at a time, joined by every connect)
        assert took < 20  # (generous: 6 compiles, each remote call bounded by the 100 ms connect deadline)
    finally:
        release.set()


def test_a_remote_named_by_host_name_is_resolved_and_used(node, project, redis_server):
    url = f"redis://localhost:{redis_server.port}/0"
    _published(node("a", remote=url), project)
    assert node("b", remote=url).compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"


def test_each_address_of_a_remotes_name_is_tried_in_turn(node, project, redis_server, monkeypatch):
    """The name resolved here was pinned to its first address: one that refused (a server
    listening on IPv4 only, "localhost" resolving to ::1 first) lost the remote, where the
    client itself tries each address."""
    import socket

    real = socket.getaddrinfo

    def two(host, port, *args, **kwargs):
        if host == "cache.two-addresses.test":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),  # (nothing listens there)
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", two)
    url = f"redis://cache.two-addresses.test:{redis_server.port}/0"
    _published(node("a", remote=url), project)
    assert node("b", remote=url).compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"


def test_credentials_are_redacted_in_the_config_and_in_errors(node, project, redis_server):
    cfg = safejit.Config(remote=f"redis://user:hunter2-secret@127.0.0.1:{redis_server.port}/0")
    assert "hunter2-secret" not in repr(cfg) and "hunter2-secret" not in str(cfg)
    rt = node("a", remote=cfg.remote)
    rt.compile(SRC, include_dirs=_inc(project))  # auth fails: a miss, not an error
    settings = rt._init()[0].remote.store.settings
    assert "hunter2-secret" not in repr(settings) and "hunter2-secret" not in str(settings)
    assert os.environ.get("SAFEJIT_REMOTE_PASSWORD") is None


@pytest.mark.parametrize("fault", ["sigstop", "client-pause"])
def test_a_stopped_or_paused_server_costs_a_bounded_wait_and_no_error_from_compile(node, project, tmp_path, fault):
    """The server stops answering (SIGSTOP, or CLIENT PAUSE) while nodes compile: every
    compile returns a working kernel, each remote wait is bounded by its deadline (the
    bound here is generous: it catches a client library's default wait of seconds),
    and once the server answers again, what another node publishes is a hit. (This
    node's breaker recovers through its probe after 5 s: test_faults.py shows that.)"""
    from ._servers import start_valkey, stopped

    server = start_valkey(tmp_path / "valkey")
    try:
        a = node("a", remote=server.url)
        a.compile(safejit.Source("#define WARM 1\n", "w"))  # connected, before the fault
        if fault == "sigstop":
            during = stopped(server.pid)
        else:
            server.admin().execute_command("CLIENT", "PAUSE", 1500, "ALL")
            during = contextlib.nullcontext()
        with during:
            for i in range(3):
                started = time.monotonic()
                assert a.compile(safejit.Source(f"#define V {i}\n", "v")).kernel("V")() == i
                assert time.monotonic() - started < 10
        assert a.stats()["compiles"] == 4 and a.stats()["remote_hits"] == 0
        assert a._init()[0].remote.store.breaker.state == "open"
        time.sleep(1.6 if fault == "client-pause" else 0)  # (the pause ends)
        assert _published(node("c", remote=server.url), project).kernel("INNER")() == 41
        b = node("b", remote=server.url)
        assert b.compile(SRC, include_dirs=_inc(project)).artifact.tier == "remote"
    finally:
        server.stop()
