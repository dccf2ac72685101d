"""A read-only cache: the cache dir bind-mounted read-only onto itself (a real mount,
as an admin makes a shared cache read-only, or a filesystem remounted ro after errors).

Hits still hit. A miss under ``on_cache_error="raise"`` is a ``CacheError`` whose errno
is ``EROFS`` — the truth, not ``EACCES`` (before, it said EACCES, sending people to fix
permissions) — and under ``"bypass"`` a working kernel. Skipped where this process may
not mount.
"""

from __future__ import annotations

import errno
import logging

import pytest

import safejit
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EARLIER_C,
    EARLIER_NAME,
    EXPECTED,
    NEW_C,
    NEW_NAME,
    leaf_paths,
    read_only_bind,
    snapshot,
)


@pytest.mark.parametrize("scratch", ["cache", "memory"])
def test_compile_in_a_read_only_cache_hits_and_a_miss_raises_erofs(seeded_cache, make_runtime, scratch):
    (earlier,) = leaf_paths(seeded_cache)
    before = snapshot(earlier)
    with read_only_bind(seeded_cache):
        rt = make_runtime(scratch=scratch)
        hit = rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME))
        assert hit.kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME] and hit.artifact.source == "disk"
        with pytest.raises(safejit.CacheError) as info:
            rt.compile(safejit.Source(NEW_C, NEW_NAME))
        assert info.value.errno == errno.EROFS, info.value
        assert f"[Errno {errno.EROFS}]" in str(info.value) and "on_cache_error='bypass'" in str(info.value)
        rt.close()  # (no usage record is written into a root that takes none)
    assert leaf_paths(seeded_cache) == {earlier} and snapshot(earlier) == before
    assert_cache_sound(seeded_cache)


def test_compile_in_a_read_only_cache_under_bypass_returns_a_working_kernel(seeded_cache, make_runtime, caplog):
    (earlier,) = leaf_paths(seeded_cache)
    with read_only_bind(seeded_cache):
        rt = make_runtime(scratch="cache", on_cache_error="bypass")
        with caplog.at_level(logging.WARNING, logger="safejit"):
            mod = rt.compile(safejit.Source(NEW_C, NEW_NAME))
        assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME] and mod.artifact.source == "bypass"
        assert rt.stats()["bypass"] == 1
        assert any("cache bypassed" in m and f"[Errno {errno.EROFS}]" in m for m in caplog.messages)
        assert rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME)).artifact.source == "disk"
        rt.close()
    assert leaf_paths(seeded_cache) == {earlier}
    assert_cache_sound(seeded_cache)
