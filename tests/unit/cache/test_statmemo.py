"""The stat memo: what one full verification may hand to later ones (same user, same
boot), and what it must never hand on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from safejit.cache import statmemo
from safejit.cache.leaf import MemoRecord
from safejit.cache.statmemo import StatMemo
from safejit.closure.hashing import RACY_WINDOW_NS

LEAF, KEY, ROOTS = "/cache/v1/t/host/ab/build-x/deps-y", "y" * 64, "s0=/src"
OLD = time.time_ns() - 10 * RACY_WINDOW_NS  # a stat well before the racy window


def _record(snap_time: int = OLD, dir_time: int = OLD) -> MemoRecord:
    return MemoRecord(
        ["{s0}/a.h", "{s0}/b.h"],
        [(1, 2, 30, snap_time, snap_time), (1, 3, 40, OLD, OLD)],
        [("{s0}/inc", (1, 4, 4096, dir_time, dir_time))],
    )


@pytest.fixture
def memo(tmp_path: Path) -> StatMemo:
    private = tmp_path / "state"
    private.mkdir(mode=0o700)
    return StatMemo(str(private))


def test_a_record_is_found_again_for_the_same_leaf_key_and_roots(memo: StatMemo) -> None:
    memo.record(LEAF, KEY, ROOTS, _record())
    found = memo.lookup(LEAF, KEY, ROOTS)
    assert found is not None
    assert (found.paths, [tuple(s) for s in found.snaps]) == (_record().paths, _record().snaps)
    assert [(p, tuple(s)) for p, s in found.dirs] == _record().dirs


@pytest.mark.parametrize(
    ("leaf", "key", "roots"),
    [("/cache/other", KEY, ROOTS), (LEAF, "z" * 64, ROOTS), (LEAF, KEY, "s0=/elsewhere")],
    ids=["another-leaf", "another-deps-key", "roots-moved"],
)
def test_a_record_of_anything_else_is_not_used(memo: StatMemo, leaf: str, key: str, roots: str) -> None:
    memo.record(LEAF, KEY, ROOTS, _record())
    assert memo.lookup(leaf, key, roots) is None


def test_a_racy_file_snapshot_records_nothing(memo: StatMemo) -> None:
    # A file changed within the racy window could change again within its timestamp
    # tick, unseen by its stat: nothing of its closure may be trusted later.
    memo.record(LEAF, KEY, ROOTS, _record(snap_time=time.time_ns()))
    assert memo.lookup(LEAF, KEY, ROOTS) is None


def test_a_racy_directory_keeps_the_files_but_drops_the_directories(memo: StatMemo) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(dir_time=time.time_ns()))
    found = memo.lookup(LEAF, KEY, ROOTS)
    assert found is not None and found.paths == _record().paths and found.dirs == []


def test_a_damaged_or_inconsistent_record_is_ignored(memo: StatMemo) -> None:
    memo.record(LEAF, KEY, ROOTS, _record())
    path = Path(memo._path(LEAF))
    path.write_bytes(path.read_bytes()[:-5])
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    memo.record(LEAF, KEY, ROOTS, MemoRecord(["{s0}/a.h", "{s0}/b.h"], [(1, 2, 30, OLD, OLD)], []))
    assert memo.lookup(LEAF, KEY, ROOTS) is None  # one path without its stat
    path.write_text('{"leaf": "x", "extra": 1}')
    assert memo.lookup(LEAF, KEY, ROOTS) is None


def test_records_are_private_files_per_boot(memo: StatMemo, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    memo.record(LEAF, KEY, ROOTS, _record())
    path = Path(memo._path(LEAF))
    assert path.parent.name == f"stat-{statmemo.boot_id()}"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    # After a reboot (another boot id) nothing of the last boot is trusted.
    monkeypatch.setattr(statmemo, "boot_id", lambda: "f" * 32)
    assert StatMemo(str(tmp_path / "state")).lookup(LEAF, KEY, ROOTS) is None
    # Without a boot id there is no memo at all: nothing written, nothing read.
    monkeypatch.setattr(statmemo, "boot_id", lambda: "")
    none = StatMemo(str(tmp_path / "state"))
    none.record("/other", KEY, ROOTS, _record())
    assert none.lookup(LEAF, KEY, ROOTS) is None
    assert sorted(os.listdir(tmp_path / "state")) == [path.parent.name]


def test_a_lookup_leaves_no_descriptor_open(memo: StatMemo) -> None:
    memo.record(LEAF, KEY, ROOTS, _record())
    path = Path(memo._path(LEAF))
    before = len(os.listdir("/proc/self/fd"))
    assert memo.lookup(LEAF, KEY, ROOTS) is not None
    path.chmod(0o666)  # others may write it: refused after it was opened
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    path.unlink()
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    assert len(os.listdir("/proc/self/fd")) == before
