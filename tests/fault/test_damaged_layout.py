"""A cache whose layout was damaged or taken away under a running process: a leaf or
build dir replaced by a file or a symlink, the whole cache dir removed or moved, a
symlink planted on the way to a build dir. Each is a rebuild (and the damage moved
aside), never a wedged kernel, and never a write through a symlink."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import safejit
from safejit.cache import maintenance
from safejit.cache.staging import settle
from tests.conftest import assert_cache_sound, leaves

SRC = safejit.Source("#define VALUE 7\n", "k")


@pytest.fixture
def fake(make_runtime):
    return lambda **cfg: make_runtime(backend="fake", **cfg)


def _only_leaf(cache_dir: Path) -> Path:
    (leaf,) = leaves(cache_dir)
    return Path(leaf.path)


@pytest.mark.parametrize("what", ["leaf-file", "leaf-symlink", "build-file", "build-symlink"])
def test_a_leaf_or_build_dir_replaced_is_quarantined_and_rebuilt(fake, cache_dir, tmp_path, what):
    fake().compile(SRC)
    leaf = _only_leaf(cache_dir)
    target = leaf if what.startswith("leaf") else leaf.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(target)
    if what.endswith("file"):
        target.write_text("not a directory")
    else:
        target.symlink_to(elsewhere, target_is_directory=True)
    # verify reports it; a fresh process rebuilds and publishes again
    assert any(bad is not None and bad.reason == "damaged" for _, bad in maintenance.verify_all(str(cache_dir)))
    rt = fake()
    mod = rt.compile(SRC)
    assert mod.kernel("VALUE")() == 7 and mod.artifact.tier == "compiled"
    assert rt.stats()["published"] == 1
    assert list(elsewhere.iterdir()) == []  # nothing was written through the symlink
    assert fake().compile(SRC).artifact.tier == "disk"
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_verify_fix_and_gc_clear_a_damaged_entry_without_following_it(fake, cache_dir, tmp_path, what):
    fake().compile(SRC)
    leaf = _only_leaf(cache_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    shutil.rmtree(leaf)
    if what == "file":
        leaf.write_text("x")
    else:
        leaf.symlink_to(elsewhere, target_is_directory=True)
    assert maintenance.check(str(cache_dir)) != []
    counts = maintenance.gc(str(cache_dir), max_age_s=3600)
    assert counts["damaged"] == 1 and not os.path.lexists(leaf)
    assert (elsewhere / "precious").read_text() == "keep me"
    assert maintenance.check(str(cache_dir)) == []


def test_the_cache_dir_removed_while_a_process_runs_is_made_again(fake, cache_dir):
    rt = fake()
    rt.compile(SRC)
    settle()  # (the spare work dirs made after a compile)
    shutil.rmtree(cache_dir)
    other = safejit.Source("#define VALUE 8\n", "k")
    assert rt.compile(other).kernel("VALUE")() == 8
    assert rt.stats()["published"] == 2 and len(leaves(cache_dir)) == 1
    assert_cache_sound(cache_dir)


def test_the_cache_dir_moved_while_a_process_runs_is_made_again(fake, cache_dir, tmp_path):
    rt = fake()
    rt.compile(SRC)
    os.rename(cache_dir, tmp_path / "moved")
    third = safejit.Source("#define VALUE 9\n", "k")
    assert rt.compile(third).kernel("VALUE")() == 9
    assert len(leaves(cache_dir)) == 1 and len(leaves(tmp_path / "moved")) == 1


def test_a_symlink_planted_on_the_way_to_a_build_dir_is_not_written_through(fake, cache_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    rt = fake()
    rt.compile(SRC)  # makes the layout
    tenant = cache_dir / "v1" / "default"
    shutil.rmtree(tenant)
    tenant.symlink_to(victim, target_is_directory=True)
    other = safejit.Source("#define VALUE 5\n", "k")
    assert fake().compile(other).kernel("VALUE")() == 5
    assert list(victim.iterdir()) == []
    assert not tenant.is_symlink() and len(leaves(cache_dir)) == 1


def test_a_cache_root_that_became_a_symlink_is_never_written_through(fake, cache_dir, tmp_path):
    rt = fake(on_cache_error="bypass")
    rt.compile(SRC)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    settle()
    shutil.rmtree(cache_dir)
    cache_dir.symlink_to(elsewhere, target_is_directory=True)
    mod = rt.compile(safejit.Source("#define VALUE 6\n", "k"))
    assert mod.kernel("VALUE")() == 6 and mod.artifact.tier == "bypass"
    assert list(elsewhere.iterdir()) == []
    cache_dir.unlink()
    cache_dir.mkdir()  # (for the fixture's teardown)


def test_a_quarantine_dir_planted_as_a_symlink_receives_nothing(fake, cache_dir, tmp_path):
    """A writer of the shared root makes ``v1/quarantine`` a symlink to a directory of
    its own: the damaged leaf a lookup sets aside never moves there (it stays, the
    build is compiled again, and nothing crosses the link)."""
    fake().compile(SRC)
    leaf = _only_leaf(cache_dir)
    (leaf / "manifest.json").write_text("{}")  # damaged
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    quarantine = cache_dir / "v1" / "quarantine"
    shutil.rmtree(quarantine, ignore_errors=True)
    quarantine.symlink_to(elsewhere, target_is_directory=True)
    assert fake().compile(SRC).kernel("VALUE")() == 7
    assert list(elsewhere.iterdir()) == [] and quarantine.is_symlink()


def test_remove_tree_never_follows_a_directory_swapped_for_a_symlink(tmp_path):
    from safejit.cache.fsio import remove_tree

    within, outside = tmp_path / "within", tmp_path / "outside"
    (within / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("x")
    (within / "a" / "link").symlink_to(outside, target_is_directory=True)
    shutil.rmtree(within / "a")
    (within / "a").symlink_to(outside, target_is_directory=True)  # the parent swapped
    with pytest.raises(OSError):
        remove_tree(str(within / "a" / "keep"), within=str(within))
    remove_tree(str(within / "a"), within=str(within))  # the link itself goes
    assert not (within / "a").exists() and (outside / "keep").read_text() == "x"
    with pytest.raises(OSError, match="outside"):
        remove_tree(str(outside), within=str(within))
    assert (outside / "keep").exists()
