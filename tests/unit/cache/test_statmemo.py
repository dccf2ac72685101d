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
from safejit.closure.hashing import RACY_WINDOW_NS, snapshot_of

LEAF, KEY, ROOTS = "/cache/v1/t/host/ab/build-x/deps-y", "y" * 64, "s0=/src"
OLD = time.time_ns() - 10 * RACY_WINDOW_NS  # a stat well before the racy window


@pytest.fixture(scope="module")
def old_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Real headers, older than the racy window (their stats may be recorded): two that
    stay as they are, and a third that one test moves."""
    where = tmp_path_factory.mktemp("deps")
    paths = [str(where / "a.h"), str(where / "b.h"), str(where / "moved.h")]
    for path in paths:
        Path(path).write_text("#define A 1\n")
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.1)
    return paths


@pytest.fixture
def deps(old_files: list[str]) -> list[str]:
    return old_files[:2]


@pytest.fixture
def memo(tmp_path: Path) -> StatMemo:
    private = tmp_path / "state"
    private.mkdir(mode=0o700)
    return StatMemo(str(private))


def _snaps(paths: list[str]) -> list[tuple[int, int, int, int, int]]:
    return [snapshot_of(os.lstat(p)) for p in paths]


def _record(deps: list[str], dir_time: int = OLD) -> MemoRecord:
    return MemoRecord(deps, _snaps(deps), [("/src/inc", (1, 4, 4096, dir_time, dir_time))])


def test_a_record_is_found_again_for_the_same_leaf_key_and_roots(memo: StatMemo, deps: list[str]) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps))
    found = memo.lookup(LEAF, KEY, ROOTS)
    assert found is not None
    assert (found.paths, found.snaps) == (deps, _snaps(deps))
    assert [(p, tuple(s)) for p, s in found.dirs] == _record(deps).dirs


def test_a_dependency_that_moved_is_no_longer_vouched_for(
    memo: StatMemo, tmp_path: Path, deps: list[str], old_files: list[str]
) -> None:
    """The stats are kept as one digest: any field of any row that moved, a row gone or
    a file become a symlink leaves the paths and directories but no stats."""
    new = tmp_path / "c.h"
    new.write_text("#define C 1\n")
    changed = [*deps, str(new)]
    record = MemoRecord(changed, [*_snaps(deps), (*_snaps([str(new)])[0][:3], OLD, OLD)], [])  # (times not now's)
    memo.record(LEAF, KEY, ROOTS, record)
    found = memo.lookup(LEAF, KEY, ROOTS)
    assert found is not None and found.paths == changed and found.snaps is None
    dep = old_files[2]
    memo.record(LEAF, KEY, ROOTS, MemoRecord([*deps, dep], _snaps([*deps, dep]), []))
    assert memo.lookup(LEAF, KEY, ROOTS).snaps == _snaps([*deps, dep])  # (the control)
    os.rename(dep, tmp_path / "away.h")
    assert memo.lookup(LEAF, KEY, ROOTS).snaps is None  # gone
    os.symlink(tmp_path / "away.h", dep)
    assert memo.lookup(LEAF, KEY, ROOTS).snaps is None  # a symlink to the same file
    os.unlink(dep)
    os.rename(tmp_path / "away.h", dep)
    assert memo.lookup(LEAF, KEY, ROOTS).snaps is None  # back, but renamed twice: its ctime moved


@pytest.mark.parametrize(
    ("leaf", "key", "roots"),
    [("/cache/other", KEY, ROOTS), (LEAF, "z" * 64, ROOTS), (LEAF, KEY, "s0=/elsewhere")],
    ids=["another-leaf", "another-deps-key", "roots-moved"],
)
def test_a_record_of_anything_else_is_not_used(
    memo: StatMemo, deps: list[str], leaf: str, key: str, roots: str
) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps))
    assert memo.lookup(leaf, key, roots) is None


def test_a_racy_file_snapshot_records_nothing(memo: StatMemo, tmp_path: Path) -> None:
    # A file changed within the racy window could change again within its timestamp
    # tick, unseen by its stat: nothing of its closure may be trusted later.
    new = tmp_path / "new.h"
    new.write_text("#define N 1\n")
    memo.record(LEAF, KEY, ROOTS, MemoRecord([str(new)], _snaps([str(new)]), []))
    assert memo.lookup(LEAF, KEY, ROOTS) is None


def test_a_racy_directory_keeps_the_files_but_drops_the_directories(memo: StatMemo, deps: list[str]) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps, dir_time=time.time_ns()))
    found = memo.lookup(LEAF, KEY, ROOTS)
    assert found is not None and found.paths == deps and found.snaps == _snaps(deps) and found.dirs == []


def test_a_damaged_or_inconsistent_record_is_ignored(memo: StatMemo, deps: list[str]) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps))
    path = Path(memo._path(LEAF))
    path.write_bytes(path.read_bytes()[:-5])
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    memo.record(LEAF, KEY, ROOTS, MemoRecord(deps, _snaps(deps)[:1], []))
    assert memo.lookup(LEAF, KEY, ROOTS) is None  # one path without its stat: not recorded
    path.write_text('{"leaf": "x", "extra": 1}')
    assert memo.lookup(LEAF, KEY, ROOTS) is None


def test_records_are_private_files_per_boot(
    memo: StatMemo, deps: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps))
    path = Path(memo._path(LEAF))
    assert path.parent.name == f"stat-{statmemo.boot_id()}"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    # After a reboot (another boot id) nothing of the last boot is trusted.
    monkeypatch.setattr(statmemo, "boot_id", lambda: "f" * 32)
    assert StatMemo(str(tmp_path / "state")).lookup(LEAF, KEY, ROOTS) is None
    # Without a boot id there is no memo at all: nothing written, nothing read.
    monkeypatch.setattr(statmemo, "boot_id", lambda: "")
    none = StatMemo(str(tmp_path / "state"))
    none.record("/other", KEY, ROOTS, _record(deps))
    assert none.lookup(LEAF, KEY, ROOTS) is None
    assert sorted(os.listdir(tmp_path / "state")) == [path.parent.name]


def test_a_lookup_leaves_no_descriptor_open(memo: StatMemo, deps: list[str]) -> None:
    memo.record(LEAF, KEY, ROOTS, _record(deps))
    path = Path(memo._path(LEAF))
    before = len(os.listdir("/proc/self/fd"))
    assert memo.lookup(LEAF, KEY, ROOTS) is not None
    path.chmod(0o666)  # others may write it: refused after it was opened
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    path.unlink()
    assert memo.lookup(LEAF, KEY, ROOTS) is None
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_stat_racy_when_its_file_was_read_is_not_recorded_however_long_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The racy rule was applied as of when the check ended: a header written just
    before it was read, by a check lasting past the window, was recorded as one whose
    stat vouches for its bytes (a write within its timestamp tick would go unseen)."""
    import types

    import safejit

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    root, cache = tmp_path / "src", tmp_path / "cache"
    (root / "inc").mkdir(parents=True)
    (root / "inc" / "h.h").write_text("#define H 2\n")
    cfg = safejit.Config(cache_dirs=(str(cache),), source_roots=(str(root),), backend="fake")
    src = safejit.Source('#include "h.h"\n#define V H\n', "v")
    with safejit.Runtime(config=cfg) as rt:
        rt.build(src, include_dirs=(str(root / "inc"),))
    # (the check "ends" 3 s after it began: the header, written a moment before it, is racy as of its read)
    monkeypatch.setattr(statmemo, "time", types.SimpleNamespace(time_ns=lambda: time.time_ns() + 3_000_000_000))
    with safejit.Runtime(config=cfg) as rt:
        assert rt.compile(src, include_dirs=(str(root / "inc"),)).artifact.tier == "disk"
    assert not list((tmp_path / "xdg").rglob("stat-*/*.json"))
