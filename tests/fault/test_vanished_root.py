"""The cache dir removed (``rm -rf``) or moved away while a process runs, with the real
host compiler: its sandbox shim, its scratch and its lock files lived in that dir too.

The next compiles make the layout again and publish into it — not just one more, every
one after (before, one more publish succeeded and then every compile raised a
``CacheError`` with EXDEV until the process restarted). Where the layout cannot be made
again (a file now stands at the cache dir's path), ``raise`` is a ``CacheError`` and
``bypass`` a working kernel; once the path is free again, the same process recovers.
(tests/fault/test_damaged_layout.py covers the same with the fake backend. The exec
shim lives in the user's private state dir, outside the cache: while it was built
into ``<root>/v1/tools``, removing the cache dir took it along, and every later
compile failed to start its compiler.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import safejit
from safejit.cache.staging import settle
from tests.conftest import assert_cache_sound, leaves, staging_residue


def _source(i: int) -> safejit.Source:
    return safejit.Source(f"int k(void) {{ return {i}; }}\n", "k")


def _take_away(cache: Path, how: str, tmp_path: Path) -> None:
    settle()  # (the spare work dirs this process makes after a compile: then gone with the rest)
    if how == "removed":
        shutil.rmtree(cache)
    else:
        os.rename(cache, tmp_path / "moved")


@pytest.mark.parametrize(
    ("how", "scratch"),
    [("removed", "cache"), ("removed", "memory"), ("moved", "memory")],
)
def test_compile_after_the_cache_dir_was_taken_away_makes_it_again(make_runtime, cache_dir, tmp_path, how, scratch):
    rt = make_runtime(scratch=scratch)
    assert rt.compile(_source(1)).kernel("k")() == 1
    _take_away(cache_dir, how, tmp_path)
    for i in (2, 3):  # (before, one more publish worked, and then none)
        mod = rt.compile(_source(i))
        assert mod.kernel("k")() == i and mod.artifact.source == "compiled"
    assert rt.stats()["published"] == 3 and rt.stats()["bypass"] == 0
    assert len(leaves(cache_dir)) == 2
    # A fresh process hits what was published into the new layout.
    assert make_runtime().compile(_source(3)).artifact.source == "disk"
    assert staging_residue(cache_dir) == []
    assert_cache_sound(cache_dir)
    if how == "moved":
        assert len(leaves(tmp_path / "moved")) == 1
        assert_cache_sound(tmp_path / "moved")


@pytest.mark.parametrize("mode", ["raise", "bypass"])
def test_compile_after_the_cache_dir_was_replaced_by_a_file_raises_or_bypasses_then_recovers(
    make_runtime, cache_dir, tmp_path, mode
):
    rt = make_runtime(on_cache_error=mode)
    assert rt.compile(_source(1)).kernel("k")() == 1
    _take_away(cache_dir, "removed", tmp_path)
    cache_dir.write_text("not a directory")
    if mode == "raise":
        with pytest.raises(safejit.CacheError) as info:
            rt.compile(_source(2))
        assert info.value.errno is not None
    else:
        mod = rt.compile(_source(2))
        assert mod.kernel("k")() == 2 and mod.artifact.source == "bypass"
    cache_dir.unlink()
    mod = rt.compile(_source(3))
    assert mod.kernel("k")() == 3 and mod.artifact.source == "compiled"
    assert len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_a_cache_dir_removed_for_good_is_not_made_again_for_a_usage_record(make_runtime, cache_dir):
    """Closing (or exiting) writes the process's usage record: into the cache dir as it
    is, never into one made again for it (a temporary cache a caller removed came back,
    holding nothing but that record)."""
    rt = make_runtime()
    rt.compile(_source(1))
    settle()  # (the staging spares made in the background: all made before the removal)
    shutil.rmtree(cache_dir)
    rt.close()
    assert not os.path.lexists(cache_dir)
