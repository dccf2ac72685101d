"""DiskTier: its roots as configured."""

from __future__ import annotations

import logging
import os
import time

import pytest

import safejit
from safejit.outcomes import Miss

ONE = safejit.Source("int one(void) { return 1; }\n", "one")


def test_a_read_only_root_that_is_missing_is_said_once(make_runtime, tmp_path, caplog):
    first, shared = tmp_path / "mine", tmp_path / "team-cache"
    rt = make_runtime(cache_dirs=(str(first), str(shared)))
    with caplog.at_level(logging.WARNING, logger="safejit.cache.disk"):
        assert rt.compile(ONE).kernel("one")() == 1
        rt.compile(safejit.Source("int two(void) { return 2; }\n", "two"))
    said = [r.getMessage() for r in caplog.records if str(shared) in r.getMessage()]
    assert len(said) == 1 and "no directory" in said[0]
    assert not shared.exists()  # (read-only: never made while the first root takes the entries)


def test_roots_that_are_there_are_not_remarked_on(make_runtime, tmp_path, caplog):
    first, shared = tmp_path / "mine", tmp_path / "team-cache"
    shared.mkdir()
    with caplog.at_level(logging.WARNING, logger="safejit.cache.disk"):
        make_runtime(cache_dirs=(str(first), str(shared))).compile(ONE)
    assert not [r for r in caplog.records if "cache root" in r.getMessage()]


def test_a_leaf_over_a_processes_limit_is_not_set_aside_for_the_others(tmp_path):
    """A process with a lower max_artifact_bytes misses a larger leaf another published
    (oversize) without reading it or moving it to quarantine; the others keep hitting it,
    and verify --fix, which checks any size, leaves it."""
    from safejit.cache import maintenance

    cache, code = str(tmp_path / "c"), safejit.Source('#define BIG "' + "x" * 5000 + '"\n#define V 1\n', "k")
    big = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(cache,)))
    assert big.compile(code).artifact.size > 4096
    small = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(cache,), max_artifact_bytes=4096))
    explained = small.explain(code)
    assert (explained.result, explained.miss) == ("miss", Miss.OVERSIZE)
    with pytest.raises(safejit.LimitExceededError):
        small.compile(code)
    assert [bad for _, bad in maintenance.verify_all(cache, fix=True)] == [None]
    again = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(cache,)))
    assert again.compile(code).artifact.tier == "disk"
    for rt in (big, small, again):
        rt.close()


def test_a_leaf_adopted_from_beyond_the_newest_leaves_of_its_key_is_a_hit_after(tmp_path):
    """Lookups look at a build key's newest MAX_LEAVES leaves. A rebuild of an older one
    loses the publish race to it and adopts it: touched then, as a hit is, it is among
    the newest after and hits (it used to be rebuilt every time)."""
    from safejit.cache.disk import MAX_LEAVES
    from safejit.closure.scan import COARSE_NS

    root, cache = tmp_path / "src", str(tmp_path / "c")
    root.mkdir()
    header = root / "v.h"
    code = safejit.Source('#include "v.h"\n', "k")

    def compile_version(v: int) -> tuple[str, int]:
        header.write_text(f"#define V {v}\n")
        os.utime(header, ns=(v * 10**9, v * 10**9))  # (a stat of its own each time)
        time.sleep(2 * COARSE_NS / 1e9)  # (a file changed just before a compile makes a build not vouched for)
        with safejit.Runtime(
            config=safejit.Config(backend="fake", cache_dirs=(cache,), source_roots=(str(root),))
        ) as rt:
            mod = rt.compile(code, include_dirs=(str(root),))
            return mod.artifact.tier, rt.stats()["compiles"]

    for v in range(MAX_LEAVES + 2):
        compile_version(v)
    assert compile_version(0)[1] == 1  # (beyond the newest: rebuilt once, the old leaf adopted)
    assert compile_version(0) == ("disk", 0)


def _one_leaf(cache_dir):
    rt = safejit.Runtime(config=safejit.Config(backend="fake", cache_dirs=(str(cache_dir),)))
    mod = rt.compile(safejit.Source("#define A 1\n", "a"))
    disk = rt._init()[0].disk
    return rt, disk, mod.artifact.path


def test_a_leaf_sound_by_the_time_it_would_be_moved_aside_stays(cache_dir):
    """A lookup that read a leaf damaged (or half-read it while a prune removed it and
    another process published it again) moved aside whatever the name held by then: a
    sound leaf published meanwhile was quarantined and lost."""
    from safejit.cache.leaf import Rejection

    rt, disk, leaf = _one_leaf(cache_dir)
    try:
        disk._quarantine_damaged(
            str(cache_dir), [Rejection(Miss.MANIFEST, "as read a moment ago", leaf, str(cache_dir))]
        )
        assert os.path.isdir(leaf) and not (cache_dir / "v1" / "quarantine").exists()
        (cache_dir / "v1" / "quarantine").mkdir()
        with open(os.path.join(leaf, "manifest.json"), "a") as fh:
            fh.write(" ")  # (damaged now, as read: moved aside)
        disk._quarantine_damaged(str(cache_dir), [Rejection(Miss.MANIFEST, "damaged", leaf, str(cache_dir))])
        assert not os.path.exists(leaf) and len(os.listdir(cache_dir / "v1" / "quarantine")) == 1
    finally:
        rt.close()


@pytest.mark.parametrize("file", ["manifest.json", "artifact"])
def test_a_leaf_removed_while_it_is_read_is_gone_not_damaged(cache_dir, monkeypatch, file):
    """A leaf pruned between the reads of its files was 'damaged' (an unreadable manifest
    or artifact), counted and logged as such; only a missing marker was 'gone'."""
    import shutil

    from safejit.cache import disk as disk_module

    rt, disk, leaf = _one_leaf(cache_dir)
    real = disk_module.read_bytes

    def pruned_meanwhile(path, limit):
        if os.path.basename(path).startswith(file):
            shutil.rmtree(leaf)  # (prune's rename away, as good as this for the reader)
        return real(path, limit)

    monkeypatch.setattr(disk_module, "read_bytes", pruned_meanwhile)
    try:
        build = os.path.basename(os.path.dirname(leaf))[len("build-") :]
        found = disk.verify(leaf, str(cache_dir), build, None)
        assert found.reason is Miss.GONE, found
    finally:
        monkeypatch.undo()
        rt.close()
