"""Power loss during a publish: no tree a power cut can leave yields a damaged hit.

A compile is watched (tests/fault/_powercut.py) from its lookup to the end of its
background work; at every fsync, rename, mkdir, unlink and fault point the model
records what is durable and what is live, and from each such instant derives every
tree the disk could hold after the power goes: directory entries as of their last
fsync (new ones lost, removed ones back) or as written back anyway, file bytes as of
their last fsync or live or half-written — for all files alike or one lagging. Each
tree is copied out and looked up the way a process does after the reboot:

* a lookup either misses or hits the very artifact that was published (never the old
  leaf's, never damaged bytes);
* ``maintenance.check`` finds nothing: a leaf is visible only once its files are
  durable, so no cut leaves a damaged leaf behind (the protocol's promise, not just
  the verifying lookup's);
* some trees hit and some miss: the cuts span the publish.

The model is also shown to catch a publish that skips its file fsyncs (a damaged
leaf becomes visible in some tree), and the verifying lookup to still refuse it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import safejit
from safejit.cache import disk as disk_module
from safejit.cache import early as early_module
from safejit.cache import maintenance
from safejit.cache.disk import DiskTier
from safejit.cache.leaf import VerifiedLeaf
from safejit.cache.staging import settle
from tests.conftest import assert_cache_sound, leaves
from tests.fault._powercut import PowerCut, materialize

SOURCE = '#include "value.h"\nint value(void) { return VALUE; }\n'
FAKE_SOURCE = '#include "value.h"\n'


def _request(backend: str, project: Path) -> tuple[safejit.Source, tuple[str, ...]]:
    code = FAKE_SOURCE if backend == "fake" else SOURCE
    return safejit.Source(code, "value"), (str(project / "include"),)


def _watch_a_publish(make_runtime, project: Path, cache: Path, backend: str, existing_build_dir: bool, monkeypatch):
    """Compile once (unless the build dir should be new), edit the header, and watch the
    compile that publishes the rebuild. Returns the model, the key, the anchors and the
    published artifact."""
    src, inc = _request(backend, project)
    config = {"backend": backend, "source_roots": (str(project),)}
    if existing_build_dir:
        make_runtime(**config).compile(src, include_dirs=inc)
        (project / "include" / "inner.h").write_text("#define INNER 7\n")
    settle()
    rt = make_runtime(**config)
    resolved = rt._init()[1].resolve((src, inc, (), (), (), None, ()))
    settle()
    model = PowerCut(cache)
    with model.watching(monkeypatch):
        model.cut("before the compile")
        mod = rt.compile(src, include_dirs=inc)
        settle()  # (the build dir's fsync, the work dir's removal, the next spares)
        model.cut("after the compile and its background work")
    inner = 7 if existing_build_dir else 41  # (the fake backend's kernels are the macros: INNER itself)
    assert mod.kernel("INNER")() == inner if backend == "fake" else mod.kernel("value")() == inner + 1
    assert rt.stats()["published"] == 1
    (published,) = [leaf for leaf in leaves(cache) if leaf.path == mod.artifact.path]
    artifact = next(Path(published.path).glob("artifact.*")).read_bytes()
    return model, resolved.key, resolved.anchors, artifact


def _after_each_cut(model: PowerCut, key: str, anchors, artifact: bytes, backend: str, tmp_path: Path):
    """Look each tree up as a process would after the reboot; (hits, misses, damaged trees)."""
    hits = misses = 0
    damaged: list[str] = []
    for n, (label, tree) in enumerate(model.images()):
        root = materialize(tree, tmp_path / "after-cut" / str(n))
        problems = maintenance.check(str(root))
        if problems:
            damaged.append(f"{label}: {problems}")
        found = DiskTier((str(root),), tenant="default", backend=backend).lookup(key, anchors)
        if isinstance(found, VerifiedLeaf):
            assert found.artifact == artifact, f"a damaged or stale hit after a cut at {label}"
            hits += 1
        else:
            misses += 1
    return hits, misses, damaged


@pytest.mark.parametrize(
    ("backend", "existing_build_dir"),
    # (the host compiler's leaf is staged early, fsynced on a background thread)
    [("fake", True), ("fake", False), ("host", True)],
    ids=["fake-rebuild", "fake-first-build", "host-rebuild"],
)
def test_publish_cut_by_power_loss_at_any_instant_never_leaves_a_damaged_hit(
    make_runtime, project, cache_dir, tmp_path, monkeypatch, backend, existing_build_dir
):
    model, key, anchors, artifact = _watch_a_publish(
        make_runtime, project, cache_dir, backend, existing_build_dir, monkeypatch
    )
    assert len(model.cuts) > 10
    hits, misses, damaged = _after_each_cut(model, key, anchors, artifact, backend, tmp_path)
    assert damaged == []
    assert hits > 0 and misses > 0, (hits, misses)
    assert_cache_sound(cache_dir)


def test_power_cut_model_catches_a_publish_that_skips_its_fsyncs(
    make_runtime, project, cache_dir, tmp_path, monkeypatch
):
    """The control: without the files' fsyncs before the rename, some cut leaves a leaf
    visible whose files are empty or half-written. The lookup still never hits it."""
    monkeypatch.setattr(disk_module, "fsync_file", lambda path: None)
    monkeypatch.setattr(early_module, "fsync_file", lambda path: None)
    model, key, anchors, artifact = _watch_a_publish(make_runtime, project, cache_dir, "fake", True, monkeypatch)
    _, misses, damaged = _after_each_cut(model, key, anchors, artifact, "fake", tmp_path)
    assert damaged != [], "the model let a publish without fsyncs pass"
    assert misses > 0
