"""A manifest is parsed strictly: every field typed and bounded, every digest 64
lowercase hex characters — the closure's rows too (checked all at once). A leaf's
negatives hold while the directories that vouch for them are unchanged, and are looked
for one by one once one changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import safejit
from safejit.cache.leaf import ManifestError, Negatives, decode_manifest
from safejit.closure import scan
from safejit.closure.scan import negative_dirs


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


def test_held_negatives_are_looked_for_one_by_one_once_a_directory_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "is_racy", lambda snap, now_ns=None: False)
    (tmp_path / "inc").mkdir()
    path = tmp_path / "inc" / "x.h"
    dirs = negative_dirs([str(path)])
    assert dirs
    negatives = Negatives(paths=[str(path)], dirs=dirs)
    assert negatives.hold()
    path.write_text("")
    assert not negatives.hold()
    path.unlink()
    assert negatives.hold() and negatives.dirs  # (recorded again)
