"""One RemoteTier, lookup after lookup on the same store, as in a long-running process: a
hit; a flipped byte in the artifact (its bytes read to the end, its BLAKE3 refused; in the
build key's head alone, its blob serves) and a
changed header (the artifact dropped unread, with its connection) are misses with their
reasons, never exceptions; once repaired the next lookup hits again on the same tier, and
none of this leaves the store holding more connections."""

from __future__ import annotations

import time

import pytest

from safejit.cache.leaf import ArtifactInfo, Manifest, Rejection, VerifiedLeaf, encode_manifest
from safejit.cache.remote.tier import RemoteTier
from safejit.cache.statmemo import StatMemo
from safejit.closure.anchors import Anchors
from safejit.closure.hashing import digest_bytes, hash_file
from safejit.keys import deps_key
from safejit.outcomes import Miss

from .conftest import BACKEND, TENANT, hexkey

K = hexkey("build")
ARTIFACT = bytes(range(256)) * 4000


def connections(admin, settled: int | None = None) -> int:
    """Connections the server holds (the admin's own included); with ``settled``, once it
    has seen a closed one go (at most 10 s: a loaded machine)."""
    deadline = time.monotonic() + 10.0
    while (n := int(admin.info("clients")["connected_clients"])) != settled and time.monotonic() < deadline:
        if settled is None:
            break
        time.sleep(0.01)
    return n


@pytest.fixture(params=["blob", "head"])
def setup(request, redis_server, make_store, tmp_path):
    """The tier, its anchors, the sources, and where the artifact is stored: its blob, and
    (``head``) the build key's head too, as an upload of a build key's first leaf leaves it."""
    src = tmp_path / "src"
    src.mkdir()
    deps = []
    for i in range(3):
        (src / f"h{i}.h").write_text(f"#define H{i} {i}\n")
        deps.append(("s0", f"h{i}.h", hash_file(str(src / f"h{i}.h"))[0]))
    deps_t, negs = tuple(sorted(deps)), (("s0", "absent.h"),)
    man = Manifest(
        build_key=K,
        deps_key=deps_key(deps_t, negs),
        backend=BACKEND,
        tenant=TENANT,
        name="k",
        deps=deps_t,
        negatives=negs,
        artifact=ArtifactInfo("artifact.cubin", len(ARTIFACT), digest_bytes(ARTIFACT)),
        kernels=("k",),
        argv=("nvrtc",),
        toolchain={},
        timings={},
        created=time.time(),
    )
    store = make_store(redis_server.url)
    store.put_blob(man.artifact_digest, ARTIFACT)
    copies = [store.layout.redis_cas(man.artifact_digest)]
    if request.param == "head":
        store.put_head(K, man.artifact_digest, ARTIFACT)
        copies.append(store.layout.redis_head(K))
    store.publish_manifest(K, man.deps_key, encode_manifest(man))
    memo_dir = tmp_path / "memo"
    memo_dir.mkdir(mode=0o700)
    tier = RemoteTier(
        store, writable=False, verifier=None, memo=StatMemo(str(memo_dir)), max_artifact_bytes=1 << 30, attrs={}
    )
    return tier, Anchors({"s0": str(src.resolve())}), src, copies


def test_misses_between_hits_on_one_tier_are_named_and_leave_no_connection_behind(redis_server, setup):
    tier, anchors, src, copies = setup
    admin = redis_server.admin()
    hit = tier.lookup(K, anchors)
    assert isinstance(hit, VerifiedLeaf) and hit.artifact == ARTIFACT
    held = connections(admin)

    stored = admin.get(copies[0])
    for key in reversed(copies):  # a flipped byte in the artifact: in the head alone, then everywhere
        admin.set(key, stored[:-1] + bytes([stored[-1] ^ 1]))
        found = tier.lookup(K, anchors)
        if key == copies[0]:
            assert isinstance(found, Rejection) and found.reason is Miss.ARTIFACT, found
        else:  # (its blob serves)
            assert isinstance(found, VerifiedLeaf) and found.artifact == ARTIFACT
    for key in copies:
        admin.set(key, stored)
    assert isinstance(tier.lookup(K, anchors), VerifiedLeaf)

    header = src / "h1.h"
    header.write_text("#define H1 changed\n")  # the closure no longer holds here
    miss = tier.lookup(K, anchors)
    assert isinstance(miss, Rejection) and miss.reason is Miss.DEP_CHANGED and miss.detail.endswith("h1.h"), miss
    header.write_text("#define H1 1\n")  # (the same bytes again: rehashed, equal)
    again = tier.lookup(K, anchors)
    assert isinstance(again, VerifiedLeaf) and again.artifact == ARTIFACT

    assert connections(admin, settled=held) == held  # the dropped connection was replaced, not added to
