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
from safejit import cli
from safejit.cache import maintenance
from safejit.cache.staging import settle
from tests.conftest import assert_cache_sound, leaves
from tests.fault._support import quarantined

SRC = safejit.Source("#define VALUE 7\n", "k")


@pytest.fixture
def fake(make_runtime):
    return lambda **cfg: make_runtime(backend="fake", **cfg)


def _only_leaf(cache_dir: Path) -> Path:
    (leaf,) = leaves(cache_dir)
    return Path(leaf.path)


def _replace(target: Path, how: str, elsewhere: Path) -> None:
    """Put a file, a symlink (to ``elsewhere``) or a FIFO where the directory ``target`` was."""
    if os.path.lexists(target):
        shutil.rmtree(target)
    if how == "file":
        target.write_text("not a directory")
    elif how == "symlink":
        target.symlink_to(elsewhere, target_is_directory=True)
    else:
        os.mkfifo(target)


def _elsewhere(tmp_path: Path) -> Path:
    """Where a planted symlink points: a directory holding something to keep."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    return elsewhere


@pytest.mark.parametrize("how", ["file", "symlink", "fifo"])
@pytest.mark.parametrize("what", ["leaf", "build"])
def test_a_leaf_or_build_dir_replaced_is_quarantined_and_rebuilt(fake, cache_dir, tmp_path, what, how):
    running = fake()
    running.compile(SRC)
    leaf = _only_leaf(cache_dir)
    target = leaf if what == "leaf" else leaf.parent
    elsewhere = _elsewhere(tmp_path)
    _replace(target, how, elsewhere)
    # verify reports it (and exits 1); a fresh process rebuilds and publishes again
    assert any(bad is not None and bad.reason == "damaged" for _, bad in maintenance.verify_all(str(cache_dir)))
    assert cli.main(["verify", "--cache-dir", str(cache_dir)]) == 1
    rt = fake()
    mod = rt.compile(SRC)
    assert mod.kernel("VALUE")() == 7 and mod.artifact.tier == "compiled"
    assert rt.stats()["published"] == 1
    assert len(quarantined(cache_dir)) == 1  # the damage itself, moved aside (not what it points to)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]  # nothing written or removed there
    assert fake().compile(SRC).artifact.tier == "disk"
    # The process that was running all along goes on: its next miss (another build) works.
    assert running.compile(safejit.Source("#define VALUE 3\n", "k")).kernel("VALUE")() == 3
    assert cli.main(["verify", "--cache-dir", str(cache_dir)]) == 0
    assert_cache_sound(cache_dir)


@pytest.mark.parametrize("how", ["file", "symlink", "fifo"])
@pytest.mark.parametrize("what", ["leaf", "build"])
def test_verify_fix_and_gc_clear_a_damaged_entry_without_following_it(fake, cache_dir, tmp_path, what, how):
    fake().compile(SRC)
    settle()  # (the build dir made ahead in the background would find the damage first and move it aside)
    leaf = _only_leaf(cache_dir)
    target = leaf if what == "leaf" else leaf.parent
    elsewhere = _elsewhere(tmp_path)
    for clear in ("verify --fix", "gc"):
        _replace(target, how, elsewhere)
        assert maintenance.check(str(cache_dir)) != []
        if clear == "gc":
            assert maintenance.gc(str(cache_dir), max_age_s=3600)["damaged"] == 1
        else:
            assert cli.main(["verify", "--fix", "--cache-dir", str(cache_dir)]) == 1  # (it reports what it fixed)
        assert not os.path.lexists(target)
        assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
        assert maintenance.check(str(cache_dir)) == []
    assert len(quarantined(cache_dir)) == 2


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
    settle()  # (the compile's background work under the tenant dir is done: nothing races the removal)
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


def test_close_after_the_cache_root_became_a_symlink_deletes_nothing_through_it(fake, cache_dir, tmp_path):
    """The spare work dirs a process made live under ``<root>/v1/tmp``; the root is then
    swapped for a symlink to a directory laid out the same way, holding someone's files
    at those very paths. ``close()`` (which deletes the spares) must not follow it."""
    rt = fake()
    rt.compile(SRC)
    settle()
    spares = sorted(p.name for p in (cache_dir / "v1" / "tmp").iterdir() if p.is_dir())  # (and the owner's mark)
    assert spares, "no spare work dirs were made (the test would prove nothing)"
    victim = tmp_path / "victim"
    shutil.copytree(cache_dir, victim, symlinks=True)
    for name in spares:
        (victim / "v1" / "tmp" / name / "precious").write_text("keep me")
    moved = tmp_path / "the-real-cache"
    os.rename(cache_dir, moved)
    cache_dir.symlink_to(victim, target_is_directory=True)
    try:
        rt.close()
        settle()
        assert sorted(p.name for p in (victim / "v1" / "tmp").iterdir() if p.is_dir()) == spares
        for name in spares:
            assert (victim / "v1" / "tmp" / name / "precious").read_text() == "keep me"
    finally:
        cache_dir.unlink()
        os.rename(moved, cache_dir)
    assert_cache_sound(cache_dir)


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


@pytest.mark.parametrize("planted", ["directory", "dangling-link", "link-out", "fifo"])
def test_something_planted_where_a_lock_file_goes_is_set_aside(fake, cache_dir, tmp_path, planted):
    """A writer of a shared root puts something that is no lock file at a key's lock
    path: every compile of that key failed (CacheError: is a directory, too many levels
    of links), and nothing cleared it. It is set aside and a lock file made in its place;
    a link's target is never touched."""
    rt = fake()
    key = rt.explain(SRC).build_key
    lock = cache_dir / "v1" / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    {
        "directory": lambda: lock.mkdir(),
        "dangling-link": lambda: lock.symlink_to(tmp_path / "nothing"),
        "link-out": lambda: lock.symlink_to(victim),
        "fifo": lambda: os.mkfifo(lock),
    }[planted]()
    assert rt.compile(SRC).kernel("VALUE")() == 7
    assert rt.stats()["compiles"] == 1
    assert lock.is_file() and not lock.is_symlink()
    assert len(quarantined(cache_dir)) == 1 and victim.read_text() == "keep me"
    assert_cache_sound(cache_dir)


def test_a_lock_file_nobody_may_open_is_set_aside(fake, cache_dir, monkeypatch):
    """Another writer's lock file of mode 0600 or 0000 (open: EACCES) failed every compile
    of that key by everyone else; it is set aside like anything else that is no usable
    lock file. (Root may open any file: the refusal is made as the kernel makes it.)"""
    from safejit.cache import disk

    rt = fake()
    key = rt.explain(SRC).build_key
    lock = cache_dir / "v1" / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    lock.chmod(0)
    real, refused = disk.lock_file, []

    def lock_file(path, *args, **kwargs):
        if not refused and os.path.basename(path) == lock.name:
            refused.append(path)
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(disk, "lock_file", lock_file)
    assert rt.compile(SRC).kernel("VALUE")() == 7
    assert refused and len(quarantined(cache_dir)) == 1 and lock.is_file()


def test_verify_fix_says_quarantined_only_of_what_it_moved(fake, cache_dir, capsys):
    """A damaged leaf that could not be moved (a cache this user may not write) was
    reported "(quarantined)", its JSON ``fixed`` too, though it stayed where it was. The
    quarantine move is the ``disk.rename`` fault point's, as faults.md says."""
    import json

    from safejit import faults

    fake().compile(SRC)
    settle()
    leaf = _only_leaf(cache_dir)
    (leaf / "manifest.json").write_text("garbage")
    with faults.inject("disk.rename", "raise:EROFS"):
        assert cli.main(["verify", "--fix", "--json", "--cache-dir", str(cache_dir)]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in report["findings"] if f["path"] == str(leaf)]
    assert not finding["fixed"] and leaf.is_dir() and quarantined(cache_dir) == []
    assert cli.main(["verify", "--fix", "--json", "--cache-dir", str(cache_dir)]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in report["findings"] if f["path"] == str(leaf)]
    assert finding["fixed"] == "quarantined" and not leaf.exists() and len(quarantined(cache_dir)) == 1


def test_a_build_dir_in_another_keys_shard_is_a_finding(fake, cache_dir, capsys):
    """A build dir moved to another shard (no lookup finds it there): ls said its manifest
    could not be read, verify that all was well, prune never removed it."""
    fake().compile(SRC)
    settle()
    build = _only_leaf(cache_dir).parent
    elsewhere = build.parent.parent / ("zz" if build.parent.name != "zz" else "yy")
    elsewhere.mkdir()
    moved = elsewhere / build.name
    build.rename(moved)
    assert maintenance.check(str(cache_dir)) != []
    assert cli.main(["verify", "--cache-dir", str(cache_dir)]) == 1
    assert "another key's shard" in capsys.readouterr().out
    assert cli.main(["ls", "--cache-dir", str(cache_dir)]) == 1
    assert "manifest cannot be read" not in capsys.readouterr().out
    assert cli.main(["verify", "--fix", "--cache-dir", str(cache_dir)]) == 1
    assert not moved.exists() and len(quarantined(cache_dir)) == 1
