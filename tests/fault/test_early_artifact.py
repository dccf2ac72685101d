"""The artifact staged while the compiler finishes (``fsio.EarlyWrite``): used only
when it holds exactly the published bytes, durably; anything else is undone and the
publish writes the file itself. A failed background fsync fails the publish, even
when a later fsync would succeed."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import safejit
from safejit import faults
from safejit.cache import fsio, spares
from safejit.cache.manifest import parse_manifest
from safejit.keys import digest_bytes
from tests.conftest import settle
from tests.fault._support import EARLIER_C, EARLIER_NAME, EXPECTED, NEW_C, NEW_NAME, leaf_paths, staging_entries


@pytest.fixture
def blank(tmp_path: Path) -> Path:
    """An empty prepared file, as ``spares.make`` leaves one in a stage."""
    path = tmp_path / "artifact.so"
    path.touch(0o644)
    return path


def test_an_early_write_is_used_only_for_the_same_bytes(blank):
    early = fsio.EarlyWrite(str(blank))
    early.write(b"first")
    settle()  # (written on a background thread)
    assert blank.read_bytes() == b"first"
    early.write(b"second")  # the compiler closed it again
    settle()
    assert blank.read_bytes() == b"second"
    assert early.use(b"second")
    assert blank.read_bytes() == b"second"


def test_other_bytes_undo_the_early_write(blank):
    early = fsio.EarlyWrite(str(blank))
    early.write(b"compiled once")
    assert not early.use(b"compiled again")  # (waits for the write, or stops it, and undoes it)
    # Left for the publish to write: gone (it creates the file afresh), or never touched.
    assert not blank.exists() or blank.read_bytes() == b""


def test_a_failed_early_write_leaves_no_partial_file(blank):
    early = fsio.EarlyWrite(str(blank))
    with faults.inject("disk.write", "raise:ENOSPC"):
        early.write(b"bytes")
        settle()
    assert not blank.exists()
    assert not early.use(b"bytes")


def test_a_failed_early_fsync_fails_its_use_after_the_fault_is_gone(blank):
    early = fsio.EarlyWrite(str(blank))
    with faults.inject("disk.fsync", "raise:EIO"):
        early.write(b"bytes")
        settle()  # the background fsync has failed
    with pytest.raises(OSError) as info:
        early.use(b"bytes")
    assert info.value.errno == errno.EIO


def test_a_cold_compile_publishes_the_artifact_staged_early(make_runtime, cache_dir, monkeypatch):
    used: list[bool] = []
    real_use = fsio.EarlyWrite.use

    def spy(self: fsio.EarlyWrite, data: bytes) -> bool:
        used.append(real_use(self, data))
        return used[-1]

    monkeypatch.setattr(fsio.EarlyWrite, "use", spy)
    mod = make_runtime().compile(safejit.Source(NEW_C, NEW_NAME))
    assert used == [True]
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    (leaf,) = leaf_paths(cache_dir)
    manifest = (Path(leaf) / "manifest.json").read_bytes()
    artifact = (Path(leaf) / "artifact.so").read_bytes()
    assert parse_manifest(manifest).artifact_size == len(artifact)
    assert mod.artifact.digest == digest_bytes(artifact)
    settle()
    assert staging_entries(cache_dir) == []
    assert sorted(os.listdir(leaf)) == [".committed", "artifact.so", "manifest.json"]


def _stage_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the directories the publish fsyncs (stages, and build dirs in the background)."""
    from safejit.cache import disk

    synced: list[str] = []

    def fsync_dir(path: str) -> None:
        synced.append(path)
        fsio.fsync_dir(path)

    monkeypatch.setattr(disk, "fsync_dir", fsync_dir)
    return synced


def _two_compiles(make_runtime: Callable[..., safejit.Runtime]) -> None:
    rt = make_runtime()
    rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME))
    spares.settle()  # the next compile takes a spare work dir, its blanks made and fsynced ahead
    assert rt.compile(safejit.Source(NEW_C, NEW_NAME)).kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]


def test_a_stage_whose_entries_are_durable_is_not_fsynced_again(make_runtime, cache_dir, monkeypatch):
    synced = _stage_fsyncs(monkeypatch)
    _two_compiles(make_runtime)
    # The first compile's work dir was made on its path, unsynced: its stage is fsynced.
    # The second's entries were made durable ahead, and the publish only filled them.
    assert [p for p in synced if p.endswith(f"/{spares.STAGE}")] == [synced[0]]
    assert len(leaf_paths(cache_dir)) == 2


def test_a_stage_whose_entries_changed_is_fsynced(make_runtime, cache_dir, monkeypatch):
    """A blank gone from a prepared stage is created by the publish: that new entry must be
    durable before the rename is, so the stage is fsynced after all."""
    real_make = spares.make

    def make(*args: object, **kwargs: object) -> spares.Workdir:
        wd = real_make(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("synced"):
            os.unlink(os.path.join(wd.stage, ".committed"))
        return wd

    monkeypatch.setattr(spares, "make", make)
    synced = _stage_fsyncs(monkeypatch)
    _two_compiles(make_runtime)
    assert len([p for p in synced if p.endswith(f"/{spares.STAGE}")]) == 2
    assert len(leaf_paths(cache_dir)) == 2


def test_an_artifact_staged_twice_has_its_stage_fsynced(make_runtime, cache_dir, monkeypatch):
    """The compiler closed its artifact twice: the first early write is undone (the file
    removed) and the file made afresh, a new entry the stage's fsync must cover."""
    real_write = fsio.EarlyWrite.write

    def write_twice(self: fsio.EarlyWrite, data: bytes) -> None:
        real_write(self, data + b"\0")
        spares.settle()  # (written, before the second close replaces it)
        real_write(self, data)

    monkeypatch.setattr(fsio.EarlyWrite, "write", write_twice)
    synced = _stage_fsyncs(monkeypatch)
    _two_compiles(make_runtime)
    assert len([p for p in synced if p.endswith(f"/{spares.STAGE}")]) == 2


def test_a_slow_cache_disk_does_not_time_the_compiler_out(make_runtime, cache_dir):
    """The early write runs off the compile's path: a compiler that ended in time is not
    killed as too slow because the cache disk is (the publish just waits for it)."""
    rt = make_runtime(compile_timeout_s=1.0)
    with faults.inject("disk.write", "delay:1.5"):
        mod = rt.compile(safejit.Source(NEW_C, NEW_NAME))
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.path in leaf_paths(cache_dir)


def test_bytes_of_a_refused_build_are_never_staged(make_runtime, cache_dir, tmp_path, monkeypatch):
    """An artifact that embeds a file from outside the roots (inline asm .incbin) is
    refused; it never reaches the cache's disk, not even its staging dir."""
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"s3cr3t-early-7f3a")
    staged: list[bytes] = []
    real_write = fsio.EarlyWrite.write
    monkeypatch.setattr(fsio.EarlyWrite, "write", lambda self, data: (staged.append(data), real_write(self, data)))
    asm = f'.section .rodata\\n.incbin \\"{secret}\\"\\n.text\\n'
    rt = make_runtime(source_roots=(str(tmp_path / "proj"),), sandbox="off")
    (tmp_path / "proj").mkdir()
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(safejit.Source(f'__asm__("{asm}");\nint s(void) {{ return 1; }}\n', "s"))
    assert staged == []
    settle()
    assert not [p for p in cache_dir.rglob("*") if p.is_file() and b"s3cr3t-early" in p.read_bytes()]


def test_a_cancelled_early_write_leaves_nothing_and_takes_no_more(blank):
    early = fsio.EarlyWrite(str(blank))
    early.write(b"bytes of a build that is not published")
    early.cancel()
    early.write(b"a late close")  # ignored: the work dir is being deleted
    settle()
    assert not blank.exists() or blank.read_bytes() == b""
    assert not early.use(b"a late close")


def test_an_oversized_artifact_is_not_left_staged(make_runtime, cache_dir):
    rt = make_runtime(max_artifact_bytes=1024)
    with pytest.raises(safejit.LimitExceededError):
        rt.compile(safejit.Source(NEW_C, NEW_NAME))
    settle()
    assert staging_entries(cache_dir) == []
    assert leaf_paths(cache_dir) == set()
