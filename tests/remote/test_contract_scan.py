"""The RemoteStore's read-only listing (``scan``, ``ping``), against both engines on real
servers: what each kind lists, with which sizes; each key once, however the pages fall;
bounded by ``limit``; foreign and malformed keys left out."""

from __future__ import annotations

import pytest

from safejit.cache.remote import RemoteError, redis, s3

from .conftest import hexkey

K1, K2 = hexkey("build1"), hexkey("build2")
D1, D2 = hexkey("deps1"), hexkey("deps2")


def _scan(store, kind: str, limit: int = 1000) -> dict[str, int]:
    found = [(s.name, s.size) for s in store.scan(kind, limit=limit)]
    assert len({name for name, _ in found}) == len(found), "a key listed twice"
    return dict(found)


@pytest.fixture
def small_pages(monkeypatch):
    """Pages of 7 keys: a listing of a few dozen keys takes several round trips."""
    monkeypatch.setattr(redis, "SCAN_PAGE", 7)
    monkeypatch.setattr(s3, "SCAN_PAGE", 7)


def test_an_empty_namespace_lists_nothing(engine_url, make_store):
    store = make_store(engine_url)
    assert [_scan(store, kind) for kind in ("index", "blob", "lease")] == [{}, {}, {}]


def test_index_scan_lists_each_build_key_with_its_leaves(engine_url, make_store):
    store = make_store(engine_url)
    store.publish_manifest(K1, D1, b"m")
    store.publish_manifest(K1, D2, b"m")
    store.publish_manifest(K2, D1, b"m")
    make_store(engine_url, tenant="t2").publish_manifest(hexkey("other tenant"), D1, b"m")
    make_store(engine_url, backend="host").publish_manifest(hexkey("other backend"), D1, b"m")
    assert _scan(store, "index") == {K1: 2, K2: 1}


def test_blob_scan_lists_the_tenants_artifacts_with_their_stored_size(engine_url, make_store):
    store = make_store(engine_url)
    store.put_blob(hexkey("small"), b"abc")
    store.put_blob(hexkey("big"), b"\0" * 200_000)
    make_store(engine_url, tenant="t2").put_blob(hexkey("theirs"), b"abc")
    found = _scan(store, "blob")
    assert set(found) == {hexkey("small"), hexkey("big")}
    assert found[hexkey("small")] == 4  # the codec byte and the bytes
    assert found[hexkey("big")] < 1000  # stored compressed
    # Blobs belong to the tenant, not to a backend:
    assert set(_scan(make_store(engine_url, backend="host"), "blob")) == set(found)


def test_lease_scan_tells_held_leases(engine_url, make_store):
    store = make_store(engine_url)
    store.acquire_lease(K1)
    released = store.acquire_lease(K2)
    assert released is not None and store.release_lease(released)
    found = _scan(store, "lease")
    assert {name for name, held in found.items() if held} == {K1}
    assert set(found) <= {K1, K2}  # (S3 keeps a released lease's object; Redis deletes it)


def test_scan_pages_through_the_keyspace_and_lists_each_key_once(engine_url, make_store, small_pages):
    ops: list[str] = []
    store = make_store(engine_url, observer=lambda op, *_: ops.append(op))
    keys = [hexkey(f"k{i}") for i in range(60)]
    for key in keys:
        store.publish_manifest(key, D1, b"m")
    for deps in (D2, hexkey("d3")):  # one index of three leaves, across page boundaries on S3
        store.publish_manifest(keys[3], deps, b"m")
    ops.clear()
    found = _scan(store, "index")
    assert found == {key: 3 if key == keys[3] else 1 for key in keys}
    assert ops.count("scan") >= 4  # several round trips, not one reply holding everything


def test_scan_stops_at_its_limit(engine_url, make_store, small_pages):
    store = make_store(engine_url)
    for i in range(20):
        store.put_blob(hexkey(f"b{i}"), b"x")
    assert len(_scan(store, "blob", limit=5)) == 5
    assert len(_scan(store, "blob", limit=21)) == 20


def test_malformed_keys_are_left_out(engine_url, make_store, request):
    store = make_store(engine_url)
    store.publish_manifest(K1, D1, b"m")
    store.put_blob(hexkey("b"), b"x")
    if engine_url.startswith("redis"):
        admin = request.getfixturevalue("redis_server").admin()
        for key in ("sj:v1:t1:cuda:idx:not-hex\x1b[2J", "sj:v1:t1:cas:" + "A" * 64, "sj:v1:t1:cuda:idx:" + "a" * 63):
            admin.set(key, b"planted")
    else:
        client = request.getfixturevalue("s3_client")
        prefix = engine_url.split("/")[3].split("?")[0]
        for key in (f"v1/t1/cuda/idx/{K2}/not-hex.json", "v1/t1/cuda/idx/zz/x.json", f"v1/t1/cas/00/{hexkey('b')}"):
            client.put_object(Bucket="sj-remote-tests", Key=f"{prefix}/{key}", Body=b"planted")
    assert _scan(store, "index") == {K1: 1}
    assert set(_scan(store, "blob")) == {hexkey("b")}


def test_an_s3_scan_passes_over_a_bounded_number_of_foreign_objects(s3_url, make_store, s3_client, small_pages):
    """Only the cache's objects counted toward ``limit``: a prefix filled with anything
    else (a writer's junk) kept ``remote stats --limit 10`` listing page after page, for
    good. Past 16 others an entry asked for, and 64, the scan is ``oversize``."""
    store = make_store(s3_url)
    store.put_blob(hexkey("b"), b"x")
    prefix = s3_url.split("/")[3].split("?")[0]
    for i in range(90):
        s3_client.put_object(Bucket="sj-remote-tests", Key=f"{prefix}/v1/t1/cas/0/junk{i:03d}", Body=b"junk")
    assert set(_scan(store, "blob", limit=2)) == {hexkey("b")}  # (listed after the junk; 96 may be passed over)
    with pytest.raises(RemoteError) as info:
        _scan(store, "blob", limit=1)
    assert info.value.reason == "oversize"


def test_ping_is_one_round_trip_and_a_down_server_is_refused(engine_url, make_store):
    ops: list[str] = []
    make_store(engine_url, observer=lambda op, *_: ops.append(op)).ping()
    assert ops == ["ping"]
    from tests.remote._servers import free_port

    port = free_port()
    down = (
        f"redis://127.0.0.1:{port}/0"
        if engine_url.startswith("redis")
        else f"s3://testing:testing@b-down?endpoint=http://127.0.0.1:{port}&region=us-east-1"
    )
    for call in (lambda s: s.ping(), lambda s: list(s.scan("index", limit=10))):
        with pytest.raises(RemoteError) as info:
            call(make_store(down))
        assert info.value.reason == "refused"
