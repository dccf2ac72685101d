"""The leaf staged while the compiler finishes (``EarlyWrite``): used only
when it holds exactly the published bytes, durably; anything else is undone and the
publish writes the files itself. A failed background fsync fails the publish, even
when a later fsync would succeed."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import wait
from pathlib import Path

import pytest

import safejit
from safejit import faults
from safejit._background import background
from safejit.cache import early as early_write
from safejit.cache import fsio
from safejit.cache import staging as spares
from safejit.cache.early import EarlyWrite
from safejit.cache.leaf import decode_manifest
from safejit.keys import digest_bytes
from tests.conftest import settle
from tests.fault._support import EARLIER_C, EARLIER_NAME, EXPECTED, NEW_C, NEW_NAME, leaf_paths, staging_entries

LEAF = ("artifact.so", "manifest.json", ".committed")


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    """A stage with its empty prepared files, as ``spares.make`` leaves one."""
    path = tmp_path / "leaf"
    path.mkdir()
    for name in LEAF:
        (path / name).touch(0o644)
    return path


def contents(stage: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in stage.iterdir()}


def test_an_early_write_is_used_only_for_the_same_bytes(stage):
    early = EarlyWrite(str(stage))
    early.write({"artifact.so": b"first"})
    assert contents(stage)["artifact.so"] == b"first"
    early.write({"artifact.so": b"second"})  # the compiler closed it again
    assert contents(stage)["artifact.so"] == b"second"
    assert early.use({"artifact.so": b"second", "manifest.json": b"{}"}) == {"artifact.so"}
    assert contents(stage)["artifact.so"] == b"second"
    assert early.dir_changed  # (the first file was removed, the second made afresh)


def test_a_whole_leaf_written_early_is_used_whole(stage):
    leaf = {"artifact.so": b"bytes", "manifest.json": b"{}", ".committed": b"digest\n"}
    early = EarlyWrite(str(stage))
    early.write(leaf)
    assert early.use(dict(leaf)) == set(leaf)
    assert contents(stage) == leaf
    assert not early.dir_changed  # every file filled its blank


def test_other_bytes_undo_the_early_write(stage):
    early = EarlyWrite(str(stage))
    early.write({"artifact.so": b"compiled once", "manifest.json": b"{1}", ".committed": b"1"})
    assert early.use({"artifact.so": b"compiled again", "manifest.json": b"{2}", ".committed": b"2"}) == set()
    # Left for the publish to write afresh.
    assert contents(stage) == {}
    assert early.dir_changed


def test_a_failed_early_write_leaves_no_partial_file(stage):
    early = EarlyWrite(str(stage))
    with faults.inject("disk.write", "raise:ENOSPC"):
        early.write({"artifact.so": b"bytes", "manifest.json": b"{}"})
    assert contents(stage) == {".committed": b""}  # what it tried is gone: the publish creates it
    assert early.dir_changed
    assert early.use({"artifact.so": b"bytes", "manifest.json": b"{}"}) == set()


def test_a_failed_early_fsync_fails_its_use_after_the_fault_is_gone(stage):
    early = EarlyWrite(str(stage))
    with faults.inject("disk.fsync", "raise:EIO"):
        early.write({"artifact.so": b"bytes"})
        spares.settle()  # the background fsync has failed
    with pytest.raises(OSError) as info:
        early.use({"artifact.so": b"bytes"})
    assert info.value.errno == errno.EIO


def test_a_stale_fsync_is_skipped_and_cannot_hide_the_error_of_what_replaced_it(stage, monkeypatch):
    """The compiler closed its artifact twice. The first write's fsync, still queued
    (the pool busy), must not fsync the second write's files: the kernel reports a
    writeback error to one fsync only, and the second write's own fsync would then
    find none and call lost data durable."""
    fsyncs: list[str] = []
    real = fsio.fsync_file

    def fsync_once_eio(path: str) -> None:
        fsyncs.append(path)
        if len(fsyncs) == 1:  # the one fsync told of the lost writeback of what is there now
            raise OSError(errno.EIO, "writeback failed", path)
        real(path)

    monkeypatch.setattr(early_write, "fsync_file", fsync_once_eio)
    gates = [threading.Event() for _ in range(8)]
    busy = [background().submit(g.wait) for g in gates]  # every worker taken
    try:
        early = EarlyWrite(str(stage))
        early.write({"artifact.so": b"first close"})
        early.write({"artifact.so": b"second close"})  # the first one's fsync still queued
    finally:
        for g in gates:
            g.set()
    wait(busy)
    with pytest.raises(OSError) as info:
        early.use({"artifact.so": b"second close"})
    assert info.value.errno == errno.EIO
    assert len(fsyncs) == 1  # the stale fsync was skipped


def test_the_marker_is_staged_after_the_before_commit_point(make_runtime, cache_dir, monkeypatch):
    """``publish.before_commit``: the leaf's other files are staged, its marker not yet —
    staged early or by the publish. A compile that goes as planned passes it once."""
    markers: list[int] = []
    real_point = faults.point

    def point(name: str) -> None:
        if name == "publish.before_commit":
            markers.extend(m.stat().st_size for m in (cache_dir / "v1" / "tmp").glob("*/leaf/.committed"))
            markers.append(-1)  # (one per pass)
        real_point(name)

    monkeypatch.setattr(faults, "point", point)
    make_runtime().compile(safejit.Source(NEW_C, NEW_NAME))
    assert markers.count(-1) == 1
    assert all(size == 0 for size in markers if size >= 0)  # blanks only: no marker written yet
    assert len(leaf_paths(cache_dir)) == 1


def test_a_cold_compile_publishes_the_leaf_staged_early(make_runtime, cache_dir, monkeypatch):
    used: list[frozenset[str]] = []
    real_use = EarlyWrite.use

    def spy(self: EarlyWrite, files: dict[str, bytes]) -> frozenset[str]:
        used.append(real_use(self, files))
        return used[-1]

    monkeypatch.setattr(EarlyWrite, "use", spy)
    mod = make_runtime().compile(safejit.Source(NEW_C, NEW_NAME))
    assert used == [set(LEAF)]  # artifact, manifest and marker: written before the compiler exited
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    (leaf,) = leaf_paths(cache_dir)
    manifest = (Path(leaf) / "manifest.json").read_bytes()
    artifact = (Path(leaf) / "artifact.so").read_bytes()
    assert decode_manifest(manifest).artifact_size == len(artifact)
    assert (Path(leaf) / ".committed").read_bytes() == digest_bytes(manifest).encode() + b"\n"
    assert mod.artifact.digest == digest_bytes(artifact)
    settle()
    assert staging_entries(cache_dir) == []
    assert sorted(os.listdir(leaf)) == sorted(LEAF)


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
    real_write = EarlyWrite.write

    def write_twice(self: EarlyWrite, files: dict[str, bytes], **kwargs: str | None) -> None:
        real_write(self, {**files, "artifact.so": files["artifact.so"] + b"\0"}, **kwargs)
        real_write(self, files, **kwargs)

    monkeypatch.setattr(EarlyWrite, "write", write_twice)
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
    staged: list[dict[str, bytes]] = []
    real_write = EarlyWrite.write
    monkeypatch.setattr(
        EarlyWrite, "write", lambda self, files, **kw: (staged.append(files), real_write(self, files, **kw))
    )
    asm = f'.section .rodata\\n.incbin \\"{secret}\\"\\n.text\\n'
    rt = make_runtime(source_roots=(str(tmp_path / "proj"),), sandbox="off")
    (tmp_path / "proj").mkdir()
    with pytest.raises(safejit.UndeclaredDependencyError):
        rt.compile(safejit.Source(f'__asm__("{asm}");\nint s(void) {{ return 1; }}\n', "s"))
    assert staged == []
    settle()
    assert not [p for p in cache_dir.rglob("*") if p.is_file() and b"s3cr3t-early" in p.read_bytes()]


def test_a_cancelled_early_write_leaves_nothing_and_takes_no_more(stage):
    early = EarlyWrite(str(stage))
    early.write({"artifact.so": b"bytes of a build that is not published"})
    early.cancel()
    early.write({"artifact.so": b"a late close"})  # ignored: the work dir is being deleted
    assert "artifact.so" not in contents(stage)
    assert early.use({"artifact.so": b"a late close"}) == set()


def test_an_oversized_artifact_is_not_left_staged(make_runtime, cache_dir):
    rt = make_runtime(max_artifact_bytes=1024)
    with pytest.raises(safejit.LimitExceededError):
        rt.compile(safejit.Source(NEW_C, NEW_NAME))
    settle()
    assert staging_entries(cache_dir) == []
    assert leaf_paths(cache_dir) == set()


def test_a_compile_while_the_interpreter_exits_does_its_background_work_itself(make_runtime, cache_dir, monkeypatch):
    """Once the interpreter is exiting, no work can be handed to a thread (a compile on a
    thread still running then): the compile does it itself, and is unharmed."""
    import concurrent.futures.thread

    rt = make_runtime()
    rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME))
    spares.settle()
    monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
    assert background().submit(threading.get_ident).result() == threading.get_ident()  # (run here)
    mod = rt.compile(safejit.Source(NEW_C, NEW_NAME))
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.path in leaf_paths(cache_dir)
    assert staging_entries(cache_dir) == []  # (its work dir removed, by itself)
