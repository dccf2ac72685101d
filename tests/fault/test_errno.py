"""Errno faults (ENOSPC, EIO, EROFS) on the compile path, injected in-process.

With ``on_cache_error="raise"`` a failed publish is a typed ``CacheError``
carrying the errno; with ``"bypass"`` the caller still gets a working kernel,
compiled privately. Either way nothing is published and no staging dir is left.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

import safejit
from safejit import cli, faults
from safejit.cache.disk import DiskTier
from safejit.cache.leaf import Rejection, VerifiedLeaf
from safejit.policy.roots import build_anchors
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EARLIER_C,
    EARLIER_NAME,
    EXPECTED,
    NEW_C,
    NEW_NAME,
    leaf_paths,
    only_leaf,
    quarantined,
    snapshot,
    staging_entries,
)

ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EROFS": errno.EROFS}
#: Points a publish passes through before anything is visible.
PUBLISH_POINTS = ("disk.write", "disk.fsync", "disk.rename", "publish.before_commit", "publish.before_rename")


def _new() -> safejit.Source:
    return safejit.Source(NEW_C, NEW_NAME)


def _earlier() -> safejit.Source:
    return safejit.Source(EARLIER_C, EARLIER_NAME)


def _assert_nothing_published(cache: Path, before: set[str]) -> None:
    assert leaf_paths(cache) == before, "a leaf was published"
    assert staging_entries(cache) == [], "a staging or work dir was left behind"
    assert quarantined(cache) == []
    assert_cache_sound(cache)


@pytest.mark.parametrize("name", sorted(ERRNOS))
@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_publish_errno_under_raise_is_a_cache_error(point, name, seeded_cache, make_runtime):
    before = leaf_paths(seeded_cache)
    rt = make_runtime(on_cache_error="raise")
    with faults.inject(point, f"raise:{name}"), pytest.raises(safejit.CacheError) as info:
        rt.compile(_new())
    assert info.value.errno == ERRNOS[name]
    assert isinstance(info.value, OSError)
    assert f"injected at {point}" in str(info.value)
    assert rt.stats()["bypass"] == 0
    _assert_nothing_published(seeded_cache, before)
    # The failure is not remembered: once the fault is gone, the same Runtime publishes.
    mod = rt.compile(_new())
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.source == "compiled" and mod.artifact.path in leaf_paths(seeded_cache)
    assert staging_entries(seeded_cache) == []
    assert_cache_sound(seeded_cache)


@pytest.mark.parametrize("name", sorted(ERRNOS))
@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_publish_errno_under_bypass_returns_a_private_kernel(point, name, seeded_cache, make_runtime, caplog):
    before = leaf_paths(seeded_cache)
    rt = make_runtime(on_cache_error="bypass")
    with faults.inject(point, f"raise:{name}"), caplog.at_level(logging.WARNING, logger="safejit"):
        mod = rt.compile(_new())
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.source == "bypass"
    assert rt.stats()["bypass"] == 1
    assert rt.stats()["published"] == 0
    bypassed = [r.getMessage() for r in caplog.records if "cache bypassed" in r.getMessage()]
    assert len(bypassed) == 1 and f"injected at {point}" in bypassed[0]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "cache bypassed" in r.getMessage())
    _assert_nothing_published(seeded_cache, before)


def test_lookup_eio_on_read_misses_and_still_returns_a_working_kernel(seeded_cache, make_runtime):
    earlier = only_leaf(seeded_cache)
    rt = make_runtime()
    with faults.inject("disk.read", "raise:EIO"):
        mod = rt.compile(_earlier())
    assert mod.kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME]
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["misses"] == 1
    assert leaf_paths(seeded_cache) == {earlier}, "the leaf is gone or a second one appeared"
    assert staging_entries(seeded_cache) == []
    assert_cache_sound(seeded_cache)
    # Once the storage reads again, the leaf is a plain hit.
    again = make_runtime().compile(_earlier())
    assert again.artifact.source == "disk" and again.artifact.path == earlier
    assert_cache_sound(seeded_cache)


def test_disk_lookup_eio_on_read_rejects_as_io_without_quarantine(seeded_cache, make_runtime):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    key = make_runtime().build(_earlier()).build_key
    disk = DiskTier((str(seeded_cache),), tenant="default", backend="host")
    with faults.inject("disk.read", "raise:EIO"):
        found = disk.lookup(key, build_anchors((), ()))
    assert isinstance(found, Rejection) and found.reason == "io"
    assert quarantined(seeded_cache) == []
    assert snapshot(earlier) == earlier_bytes
    assert isinstance(disk.verify(earlier, disk.roots[0], key, None), VerifiedLeaf)
    assert_cache_sound(seeded_cache)


def test_lookup_eio_on_read_does_not_quarantine_the_good_leaf(seeded_cache, make_runtime):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    rt = make_runtime()
    with faults.inject("disk.read", "raise:EIO"):
        mod = rt.compile(_earlier())
    assert mod.kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME]
    assert quarantined(seeded_cache) == [], "a good leaf was quarantined over a read error"
    assert snapshot(earlier) == earlier_bytes, "the good leaf was replaced"
    assert_cache_sound(seeded_cache)


def test_verify_fix_eio_on_read_does_not_quarantine_the_good_leaf(seeded_cache):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    with faults.inject("disk.read", "raise:EIO"):
        cli.main(["verify", "--fix", "--cache-dir", str(seeded_cache)])
    assert quarantined(seeded_cache) == [], "a good leaf was quarantined over a read error"
    assert snapshot(earlier) == earlier_bytes
    assert_cache_sound(seeded_cache)


@pytest.mark.parametrize("name", sorted(ERRNOS))
def test_first_use_fsync_errno_under_raise_is_a_cache_error_with_errno(name, cache_dir, make_runtime):
    rt = make_runtime(on_cache_error="raise")
    with faults.inject("disk.fsync", f"raise:{name}"), pytest.raises(safejit.CacheError) as info:
        rt.compile(_new())
    assert leaf_paths(cache_dir) == set()
    assert_cache_sound(cache_dir)
    assert info.value.errno == ERRNOS[name]


def test_compile_enospc_on_spawn_is_a_compile_error(seeded_cache, make_runtime):
    before = leaf_paths(seeded_cache)
    rt = make_runtime()
    with faults.inject("compiler.spawn", "raise:ENOSPC"), pytest.raises(safejit.CompileError) as info:
        rt.compile(_new())
    assert not isinstance(info.value, safejit.CacheError)
    assert os.strerror(errno.ENOSPC) in str(info.value)
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 0
    _assert_nothing_published(seeded_cache, before)
    assert rt.compile(_new()).kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert_cache_sound(seeded_cache)


def test_load_eio_is_a_load_error(seeded_cache, make_runtime):
    before = leaf_paths(seeded_cache)
    rt = make_runtime()
    with faults.inject("load", "raise:EIO"), pytest.raises(safejit.LoadError) as info:
        rt.compile(_new())
    assert os.strerror(errno.EIO) in str(info.value)
    assert rt.stats()["memory_entries"] == 0, "a module that failed to load was cached in memory"
    # Loading comes after a complete publish: the leaf is there, whole, and serves the retry.
    (published,) = leaf_paths(seeded_cache) - before
    assert staging_entries(seeded_cache) == []
    assert_cache_sound(seeded_cache)
    mod = rt.compile(_new())
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.source == "disk" and mod.artifact.path == published
    assert_cache_sound(seeded_cache)
