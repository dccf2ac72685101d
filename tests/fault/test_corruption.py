"""Corruption faults: damaged bytes in a published leaf are never served.

The publishing process keeps its own (good) bytes; every later reader detects
the damage, quarantines the leaf and rebuilds; ``safejit verify`` names the
reason and ``verify --fix`` moves the leaf aside.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import safejit
from safejit import cli, faults
from safejit.cache import maintenance
from safejit.cache.layout import MANIFEST, MARKER
from safejit.cache.layout import VERSION as LAYOUT
from tests.conftest import assert_cache_sound
from tests.fault._support import (
    EARLIER_C,
    EARLIER_NAME,
    EXPECTED,
    NEW_C,
    NEW_NAME,
    leaf_paths,
    only_leaf,
    quarantined,
    run_verify,
    snapshot,
    staging_entries,
)

ARTIFACT = "artifact.so"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _delete(path: Path) -> None:
    path.unlink()


DAMAGE = {"flip": _flip, "truncate": _truncate, "empty": _empty, "missing": _delete}
#: (file, damage) -> the reason verification gives. A marker that is present but
#: wrong no longer matches the manifest's digest; only a missing one is "marker".
CASES = {
    (ARTIFACT, "flip"): "artifact",
    (ARTIFACT, "truncate"): "artifact",
    (ARTIFACT, "empty"): "artifact",
    (ARTIFACT, "missing"): "artifact",
    (MANIFEST, "flip"): "manifest",
    (MANIFEST, "truncate"): "manifest",
    (MANIFEST, "empty"): "manifest",
    (MANIFEST, "missing"): "manifest",
    (MARKER, "flip"): "manifest",
    (MARKER, "truncate"): "manifest",
    (MARKER, "empty"): "manifest",
    (MARKER, "missing"): "marker",
}
CASE_IDS = [f"{file}-{damage}" for file, damage in CASES]


def _damage(cache: Path, file: str, damage: str) -> tuple[str, dict[str, bytes]]:
    """Damage one file of the cache's only leaf; the leaf and its damaged contents."""
    leaf = only_leaf(cache)
    before = snapshot(leaf)
    DAMAGE[damage](Path(leaf) / file)
    damaged = snapshot(leaf)
    assert damaged != before
    return leaf, damaged


def test_publish_corrupt_on_write_is_detected_quarantined_and_rebuilt(seeded_cache, make_runtime, caplog):
    before = leaf_paths(seeded_cache)
    writer = make_runtime()
    with faults.inject("disk.write", "corrupt"):
        mod = writer.compile(safejit.Source(NEW_C, NEW_NAME))
    # The publisher loads the bytes it compiled, not what reached the disk.
    assert mod.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert mod.artifact.source == "compiled"
    (damaged,) = leaf_paths(seeded_cache) - before
    assert mod.artifact.path == damaged
    problems = maintenance.check(str(seeded_cache))
    assert len(problems) == 1 and problems[0].startswith(damaged), problems

    reader = make_runtime()
    with caplog.at_level(logging.INFO, logger="safejit"):
        again = reader.compile(safejit.Source(NEW_C, NEW_NAME))
    assert again.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]
    assert again.artifact.source == "compiled"
    assert reader.stats()["disk_hits"] == 0 and reader.stats()["compiles"] == 1
    assert reader.stats()["published"] == 1
    assert len(quarantined(seeded_cache)) == 1
    assert any(m.startswith(f"rebuilding {NEW_NAME}: ") for m in caplog.messages), caplog.messages
    assert leaf_paths(seeded_cache) == {*before, damaged}  # the rebuilt leaf, in the same place
    assert staging_entries(seeded_cache) == []
    assert_cache_sound(seeded_cache)
    # And the rebuilt leaf really is whole: a third process hits it.
    third = make_runtime().compile(safejit.Source(NEW_C, NEW_NAME))
    assert third.artifact.source == "disk" and third.kernel(NEW_NAME)(6, 7) == EXPECTED[NEW_NAME]


def _verify(cache: Path, *extra: str) -> tuple[int, dict[str, str]]:
    """``safejit verify`` run in this process (the command's own code, without starting
    an interpreter for each of the cases below): its exit status, and the failures
    verification reported, ``{leaf: reason}``."""
    reasons = {info.path: str(bad.reason) for info, bad in maintenance.verify_all(str(cache)) if bad is not None}
    return cli.main(["verify", "--cache-dir", str(cache), *extra]), reasons


@pytest.mark.parametrize(("file", "damage"), list(CASES), ids=CASE_IDS)
def test_verify_hand_corrupted_leaf_fails_then_fix_quarantines(file, damage, seeded_cache, make_runtime):
    leaf, _ = _damage(seeded_cache, file, damage)
    reason = CASES[file, damage]

    status, reasons = _verify(seeded_cache)
    assert (status, reasons) == (1, {leaf: reason})
    assert os.path.isdir(leaf), "plain verify must not move anything"

    status, _ = _verify(seeded_cache, "--fix")
    assert status == 1
    assert not os.path.exists(leaf)
    assert len(quarantined(seeded_cache)) == 1

    assert _verify(seeded_cache) == (0, {})
    assert_cache_sound(seeded_cache)
    rt = make_runtime()
    assert rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME)).kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME]
    assert rt.stats()["compiles"] == 1
    assert leaf_paths(seeded_cache) == {leaf}
    assert_cache_sound(seeded_cache)


def test_verify_command_on_a_corrupted_leaf_names_the_reason_and_fix_quarantines(seeded_cache):
    """The command itself, as an operator runs it: one line per failure, the exit status."""
    leaf, _ = _damage(seeded_cache, ARTIFACT, "flip")
    found = run_verify(seeded_cache)
    assert found.returncode == 1, found.stdout + found.stderr
    assert f"FAIL {leaf}: artifact: " in found.stdout, found.stdout
    assert "0/1 leaves verify" in found.stdout
    fixed = run_verify(seeded_cache, "--fix")
    assert fixed.returncode == 1
    assert f"FAIL {leaf}: artifact: " in fixed.stdout and "(quarantined)" in fixed.stdout, fixed.stdout
    assert not os.path.exists(leaf)
    clean = run_verify(seeded_cache)
    assert clean.returncode == 0, clean.stdout
    assert_cache_sound(seeded_cache)


@pytest.mark.parametrize(("file", "damage"), list(CASES), ids=CASE_IDS)
def test_lookup_hand_corrupted_leaf_is_quarantined_and_rebuilt(file, damage, seeded_cache, make_runtime):
    leaf, damaged = _damage(seeded_cache, file, damage)
    rt = make_runtime()
    mod = rt.compile(safejit.Source(EARLIER_C, EARLIER_NAME))
    assert mod.kernel(EARLIER_NAME)(6, 7) == EXPECTED[EARLIER_NAME]
    assert mod.artifact.source == "compiled"
    assert rt.stats()["disk_hits"] == 0 and rt.stats()["compiles"] == 1 and rt.stats()["published"] == 1
    (moved,) = quarantined(seeded_cache)
    # The damaged leaf is kept aside as it was, for inspection; a whole one took its place.
    assert snapshot(seeded_cache / LAYOUT / "quarantine" / moved) == damaged
    assert leaf_paths(seeded_cache) == {leaf}
    assert staging_entries(seeded_cache) == []
    assert_cache_sound(seeded_cache)
    assert make_runtime().compile(safejit.Source(EARLIER_C, EARLIER_NAME)).artifact.source == "disk"
