"""Facts about a closure (``safejit.closure.scan``): the directories that vouch for
negatives are recorded before the paths are found absent, never after; a closure
scanned while the compiler ran holds only while its files and negatives are as scanned."""

from __future__ import annotations

import pytest

from safejit.closure import scan
from safejit.closure.hashing import snapshot_of
from safejit.closure.scan import Closure, negative_dirs, unchanged


@pytest.fixture
def settled(monkeypatch):
    """Directories count as changed long ago (the racy window is 2 s)."""
    monkeypatch.setattr(scan, "is_racy", lambda snap, now_ns=None: False)


def test_negative_dirs_records_the_deepest_existing_directory(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    dirs = negative_dirs([str(tmp_path / "inc" / "a.h"), str(tmp_path / "inc" / "gone" / "b.h")])
    assert dirs is not None and [d for d, _ in dirs] == [str(tmp_path / "inc")]


def test_a_directory_changed_within_the_racy_window_vouches_for_nothing(tmp_path):
    (tmp_path / "inc").mkdir()  # (just now)
    assert negative_dirs([str(tmp_path / "inc" / "a.h")]) == []


def test_a_negative_that_is_there_is_none_however_old(tmp_path, settled):
    """The old order (paths found absent, then the directories recorded) vouched for a
    path made in between once its directory's change was older than the racy window."""
    (tmp_path / "inc").mkdir()
    there = tmp_path / "inc" / "shadow.h"
    there.write_text("#define SHADOW 1\n")
    assert negative_dirs([str(tmp_path / "inc" / "other.h"), str(there)]) is None


def test_a_path_made_right_after_the_directories_were_recorded_is_seen(tmp_path, monkeypatch, settled):
    (tmp_path / "inc").mkdir()
    path = tmp_path / "inc" / "late.h"
    real = scan._deepest_dirs

    def then_a_writer(paths):
        found = real(paths)
        path.write_text("")  # after the directory's stat, before the paths are looked for
        return found

    monkeypatch.setattr(scan, "_deepest_dirs", then_a_writer)
    assert negative_dirs([str(path)]) is None


def _closure(tmp_path, negatives):
    dep = tmp_path / "inc" / "one.h"
    dep.write_text("#define ONE 1\n")
    state = (str(dep), snapshot_of(dep.stat()), "0" * 64)
    return Closure([], [state], [], [], [str(p) for p in negatives])


@pytest.mark.parametrize("vouched", [True, False], ids=["by-directory", "path-by-path"])
def test_an_early_closure_stops_holding_once_a_negative_appears(tmp_path, settled, vouched):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "sub").mkdir()
    negative = tmp_path / "inc" / "sub" / "two.h"
    closure = _closure(tmp_path, [negative, tmp_path / "inc" / "gone" / "three.h"])
    dirs = negative_dirs(closure.negative_paths) if vouched else []
    assert dirs is not None and bool(dirs) == vouched
    assert unchanged(closure, dirs)
    negative.write_text("")
    assert not unchanged(closure, dirs)


def test_an_early_closure_stops_holding_once_a_missing_directory_appears(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    closure = _closure(tmp_path, [tmp_path / "inc" / "gone" / "three.h"])
    dirs = negative_dirs(closure.negative_paths)
    assert dirs and unchanged(closure, dirs)
    (tmp_path / "inc" / "gone").mkdir()  # (the deepest existing directory gains an entry)
    assert not unchanged(closure, dirs)


def test_an_early_closure_stops_holding_once_a_file_changes(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    closure = _closure(tmp_path, [])
    assert unchanged(closure, [])
    (tmp_path / "inc" / "one.h").write_text("#define ONE 22\n")  # (a size of its own: the same tick may pass)
    assert not unchanged(closure, [])
