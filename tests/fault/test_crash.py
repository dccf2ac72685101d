"""Crash faults: a process that dies (SIGKILL) anywhere on the compile path
leaves no half-written leaf visible, does not touch earlier leaves, and does not
stop the next process from compiling.

Each test runs a real child (``sys.executable -c ...``) against a cache that
already holds one earlier leaf; the child's death is the real thing, either
``SAFEJIT_FAULTS="<point>=crash"`` (``os.kill(getpid(), SIGKILL)``) or a SIGKILL
sent from here while the child sleeps inside the publish protocol.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

import safejit
from safejit import cli
from safejit._proc import owner
from safejit.cache import staging as spares
from safejit.cache.layout import MANIFEST, MARKER
from safejit.cache.layout import VERSION as LAYOUT
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EARLIER_C,
    EARLIER_NAME,
    EXPECTED,
    NEW_C,
    NEW_NAME,
    SIGKILLED,
    MakeRuntime,
    kill_and_reap,
    leaf_paths,
    only_leaf,
    run_child,
    snapshot,
    staging_entries,
    start_child,
    wait_for,
)

#: Every point a compile passes through, in path order. ``disk.read`` is reached
#: only by a lookup that finds a leaf, so that child compiles the earlier source.
CRASH_POINTS = (
    "disk.read",
    "lock.acquire",
    "compiler.spawn",
    "disk.write",
    "disk.fsync",
    "publish.before_commit",
    "publish.before_rename",
    "disk.rename",
    "publish.after_rename",
    "load",
)
#: Points inside the publish protocol before its rename: a staging dir is left behind.
STAGING = frozenset({"disk.write", "disk.fsync", "publish.before_commit", "publish.before_rename", "disk.rename"})
#: Points where the killed compile's work dir holds what it wrote (its source, a staged leaf).
WORK_DIR_WRITTEN = frozenset({"compiler.spawn", *STAGING, "publish.after_rename"})
#: Points past the publishing rename: the new leaf is complete and visible.
AFTER_PUBLISH = frozenset({"publish.after_rename", "load"})
REPEATS = 3


def _assert_recovered(
    cache: Path, earlier: str, earlier_bytes: dict[str, bytes], make_runtime: MakeRuntime
) -> safejit.Runtime:
    """What every crash test ends with: the earlier leaf untouched, ``safejit
    verify`` clean, a normal run correct, the cache sound."""
    assert os.path.isdir(earlier), "the earlier leaf disappeared"
    assert snapshot(earlier) == earlier_bytes, "the earlier leaf changed"
    # (``safejit verify`` in this process: the command's code, one interpreter start less)
    assert cli.main(["verify", "--cache-dir", str(cache)]) == 0
    rt: safejit.Runtime = make_runtime(lock_timeout_s=5)
    mod = rt.compile(safejit.Source(NEW_C, NEW_NAME))
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.path in leaf_paths(cache)
    assert_cache_sound(cache)
    return rt


@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_compile_crash_at_point_leaves_no_partial_leaf(point, repeat, seeded_cache, make_runtime):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    name, code = (EARLIER_NAME, EARLIER_C) if point == "disk.read" else (NEW_NAME, NEW_C)

    child = run_child(seeded_cache, name, code, faults=f"{point}=crash")

    assert child.returncode == SIGKILLED, f"child was not killed at {point}: {child.returncode}\n{child.stderr}"
    assert child.stdout == "", "the child got past the crash point"
    # It died where intended: with its work dir written to (source staged, maybe a leaf
    # staged in it) exactly from the compiler's start until that dir is deleted after
    # the publishing rename (``load`` comes after the deletion was handed to a thread).
    residue = staging_entries(seeded_cache)
    if point in WORK_DIR_WRITTEN:
        assert residue, point
    elif point != "load":
        assert not residue, (point, residue)
    assert_cache_sound(seeded_cache)  # every visible leaf verifies: nothing half-written
    published = point in AFTER_PUBLISH
    assert len(leaf_paths(seeded_cache)) == (2 if published else 1)
    rt = _assert_recovered(seeded_cache, earlier, earlier_bytes, make_runtime)
    # The crash left either a complete leaf (hit) or none at all (one clean compile).
    assert rt.stats()["compiles"] == (0 if published else 1)
    assert rt.stats()["disk_hits"] == (1 if published else 0)
    assert rt.stats()["bypass"] == 0
    assert_cache_sound(seeded_cache)


@pytest.mark.parametrize(
    ("point", "staged_file"),
    [
        ("publish.before_commit", MANIFEST),  # artifact and manifest staged, no marker
        ("publish.before_rename", MARKER),  # staging complete and fsynced, not yet renamed
    ],
)
def test_publish_sigkill_while_staged_leaves_no_partial_leaf(point, staged_file, seeded_cache, make_runtime):
    earlier = only_leaf(seeded_cache)
    earlier_bytes = snapshot(earlier)
    tmp = seeded_cache / LAYOUT / "tmp"
    child = start_child(seeded_cache, NEW_NAME, NEW_C, faults=f"{point}=delay:20")
    try:
        # (the prepared stage, or, where the compiler worked in the work dir, one of its own)
        stages = (f"*/leaf/{staged_file}", f"*/{staged_file}")
        staged = wait_for(lambda: [p for g in stages for p in tmp.glob(g) if p.stat().st_size], proc=child)
    finally:
        returncode = kill_and_reap(child)

    assert returncode == SIGKILLED
    assert len(staged) == 1
    stage = staged[0].parent
    assert stage.is_dir(), "the killed child's staging dir should be left behind, not published"
    assert leaf_paths(seeded_cache) == {earlier}, "a staged leaf became visible"
    assert_cache_sound(seeded_cache)
    rt = _assert_recovered(seeded_cache, earlier, earlier_bytes, make_runtime)
    assert rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    assert_cache_sound(seeded_cache)


@pytest.mark.skipif(spares.memory_scratch() is None, reason="no /dev/shm")
def test_memory_scratch_of_a_killed_compile_is_removed_by_the_next_process(seeded_cache, tmp_path):
    """A compiler works in a private directory in memory. A process killed mid-compile
    leaves its own there (source and all); the next process to use the scratch removes
    the directories of processes that are gone, and only those."""
    base = Path(spares.memory_scratch() or "")
    child = start_child(seeded_cache, NEW_NAME, NEW_C, faults=f"compiler.spawn=delay:{20}", scratch="memory")
    try:
        mine = wait_for(lambda: [d for d in base.glob(f"p{child.pid}.*-*") if list(d.glob("src/*.c"))], proc=child)
    finally:
        assert kill_and_reap(child) == SIGKILLED
    (left,) = mine
    assert NEW_C.encode() in next(left.glob("src/*.c")).read_bytes()
    assert staging_entries(seeded_cache) == [], "the compile's files were in memory, not in the cache root"
    alive = base / f"{owner(str(base))}-keep"  # a live process's scratch must survive the sweep
    alive.mkdir()
    # ...and so must that of a live process whose pid means nothing here (another PID
    # namespace sharing /dev/shm): its pid is no process of ours, but it holds its mark.
    token = f"p{2**22 + 7}.{os.urandom(6).hex()}"
    mark = os.open(base / f"{token}.alive", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    fcntl.flock(mark, fcntl.LOCK_SH)
    elsewhere = base / f"{token}-busy"
    elsewhere.mkdir()
    try:
        after = run_child(seeded_cache, NEW_NAME, NEW_C, faults=None, scratch="memory")
        assert after.returncode == 0, after.stderr
        assert after.stdout.split()[0] == str(EXPECTED[NEW_NAME])
        assert not left.exists(), "a dead process's scratch was left in memory"
        assert alive.is_dir() and elsewhere.is_dir()
    finally:
        alive.rmdir()
        elsewhere.rmdir()
        os.close(mark)
        os.unlink(base / f"{token}.alive")
    assert_cache_sound(seeded_cache)
