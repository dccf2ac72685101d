"""The artifact staged while the compiler finishes (``fsio.EarlyWrite``): used only
when it holds exactly the published bytes, durably; anything else is undone and the
publish writes the file itself. A failed background fsync fails the publish, even
when a later fsync would succeed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import safejit
from safejit import faults
from safejit.cache import fsio
from safejit.cache.manifest import parse_manifest
from safejit.keys import digest_bytes
from tests.conftest import settle
from tests.fault._support import EXPECTED, NEW_C, NEW_NAME, leaf_paths, staging_entries


@pytest.fixture
def blank(tmp_path: Path) -> Path:
    """An empty prepared file, as ``spares.make`` leaves one in a stage."""
    path = tmp_path / "artifact.so"
    path.touch(0o644)
    return path


def test_an_early_write_is_used_only_for_the_same_bytes(blank):
    early = fsio.EarlyWrite(str(blank))
    early.write(b"first")
    assert blank.read_bytes() == b"first"
    early.write(b"second")  # the compiler closed it again
    assert blank.read_bytes() == b"second"
    assert early.use(b"second")
    assert blank.read_bytes() == b"second"


def test_other_bytes_undo_the_early_write(blank):
    early = fsio.EarlyWrite(str(blank))
    early.write(b"compiled once")
    assert not early.use(b"compiled again")
    assert not blank.exists()  # the publish creates it afresh (O_EXCL)


def test_a_failed_early_write_leaves_no_partial_file(blank):
    early = fsio.EarlyWrite(str(blank))
    with faults.inject("disk.write", "raise:ENOSPC"):
        early.write(b"bytes")
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
