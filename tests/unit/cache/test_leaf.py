"""A manifest is parsed strictly: every field typed and bounded, every digest 64
lowercase hex characters — the closure's rows too (checked all at once). The
directories that vouch for a leaf's negatives are recorded before the paths are found
absent, never after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import safejit
from safejit.cache import leaf as leaf_module
from safejit.cache.leaf import ManifestError, Negatives, decode_manifest, negative_dirs


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("leaf")
    (root / "inc").mkdir()
    (root / "inc" / "one.h").write_text("#define ONE 1\n")
    rt = safejit.Runtime(config=safejit.Config(cache_dirs=(str(root / "cache"),), source_roots=(str(root),)))
    art = rt.build(
        safejit.Source('#include "one.h"\nint f(void) { return ONE; }\n', "f"), include_dirs=(str(root / "inc"),)
    )
    rt.close()
    return json.loads((Path(art.path) / "manifest.json").read_bytes())


def test_a_published_manifest_decodes(manifest):
    assert decode_manifest(json.dumps(manifest).encode()).deps_key == manifest["deps_key"]


@pytest.mark.parametrize(
    "digest",
    ["A" * 64, "g" * 64, " " + "a" * 63, "a" * 63, "a" * 65, "é" * 64, "0x" + "a" * 62],
    ids=["upper", "not-hex", "space", "short", "long", "non-ascii", "prefixed"],
)
def test_a_dependency_digest_that_is_not_64_lowercase_hex_is_refused(manifest, digest):
    deps = [list(row) for row in manifest["deps"]]
    assert deps, "the build read a header"
    deps[-1][2] = digest
    with pytest.raises(ManifestError):
        decode_manifest(json.dumps({**manifest, "deps": deps}).encode())


# -- negatives: the directories that vouch for paths that must stay absent ----------------


@pytest.fixture
def settled(monkeypatch):
    """Directories count as changed long ago (the racy window is 2 s)."""
    monkeypatch.setattr(leaf_module, "is_racy", lambda snap, now_ns=None: False)


def test_negative_dirs_records_the_deepest_existing_directory(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    dirs = negative_dirs([str(tmp_path / "inc" / "a.h"), str(tmp_path / "inc" / "gone" / "b.h")])
    assert dirs is not None and [d for d, _ in dirs] == [str(tmp_path / "inc")]


def test_a_negative_that_is_there_is_none_however_old(tmp_path, settled):
    """The old order (paths found absent, then the directories recorded) vouched for a
    path made in between once its directory's change was older than the racy window."""
    (tmp_path / "inc").mkdir()
    there = tmp_path / "inc" / "shadow.h"
    there.write_text("#define SHADOW 1\n")
    assert negative_dirs([str(tmp_path / "inc" / "other.h"), str(there)]) is None
    negatives = Negatives(paths=[str(there)], dirs=[])
    assert not negatives.hold() and negatives.dirs == []


def test_a_path_made_right_after_the_directories_were_recorded_is_seen(tmp_path, monkeypatch, settled):
    (tmp_path / "inc").mkdir()
    path = tmp_path / "inc" / "late.h"
    real = leaf_module._deepest_dirs

    def then_a_writer(paths):
        found = real(paths)
        path.write_text("")  # after the directory's stat, before the paths are looked for
        return found

    monkeypatch.setattr(leaf_module, "_deepest_dirs", then_a_writer)
    assert negative_dirs([str(path)]) is None


def test_held_negatives_are_checked_path_by_path_once_a_directory_changes(tmp_path, settled):
    (tmp_path / "inc").mkdir()
    path = tmp_path / "inc" / "x.h"
    dirs = negative_dirs([str(path)])
    assert dirs
    negatives = Negatives(paths=[str(path)], dirs=dirs)
    assert negatives.hold()
    path.write_text("")
    assert not negatives.hold()
