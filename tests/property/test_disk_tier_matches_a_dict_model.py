"""DiskTier.publish / lookup_root on a real directory against a dict model.

The model is ``{build_key: {deps_key: leaf}}``, each leaf holding its artifact
bytes and the closure it was published with (header digests and negative
paths), plus the leaves the test has damaged and the current state of the
source root (headers edited or not, negative paths created or not).

A lookup returns only a leaf that is intact and current, with exactly the
model's bytes; it misses only when no such leaf exists; it quarantines every
damaged leaf it meets (the root is writable) and leaves merely outdated ones
in place. ``maintenance.check`` reports exactly the damaged leaves still on
disk, and nothing once the sweep has moved them aside.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from safejit.cache import maintenance
from safejit.cache.disk import DiskTier
from safejit.cache.layout import MANIFEST, MARKER
from safejit.cache.leaf import ArtifactInfo, Manifest, Negatives, Rejection, VerifiedLeaf
from safejit.closure.anchors import Anchors
from safejit.closure.hashing import hash_file
from safejit.keys import deps_key, digest_bytes
from safejit.outcomes import CORRUPT as CORRUPT_REASONS
from tests.conftest import staging_residue

TENANT = "default"
BACKEND = "host"
EXT = "so"
ARTIFACT = f"artifact.{EXT}"
BUILD_KEYS = tuple(digest_bytes(f"build {i}".encode()) for i in range(2))
HEADERS = ("a.h", "b.h", "sub/c.h")
#: Two contents per header: as checked out, and edited.
CONTENTS = tuple((f"#define H{i} {i}\n".encode(), f"#define H{i} {i + 100}\n".encode()) for i in range(len(HEADERS)))
#: Paths a compile looked up and did not find (shadowing candidates).
NEGATIVES = ("shadow.h", "sub/absent.h")

#: Damage that breaks the leaf's commit (marker/manifest): found before its deps are looked at.
COMMIT_DAMAGE = ("edit_manifest", "delete_marker", "garbage_marker")
#: Damage to the artifact bytes (or a manifest vouching for other bytes): found last.
ARTIFACT_DAMAGE = ("flip_artifact_byte", "truncate_artifact", "grow_artifact", "delete_artifact", "lying_manifest")


@dataclass(frozen=True)
class Leaf:
    artifact: bytes
    deps: tuple[tuple[str, str, str], ...]
    negatives: tuple[tuple[str, str], ...]


def make_manifest(
    build_key: str, deps: tuple[tuple[str, str, str], ...], negatives: tuple[tuple[str, str], ...], artifact: bytes
) -> Manifest:
    """What safejit.runtime._manifest builds for a host compile."""
    dep_tuples = tuple(sorted(deps))
    negs = tuple(sorted(negatives))
    return Manifest(
        build_key=build_key,
        deps_key=deps_key(dep_tuples, negs),
        backend=BACKEND,
        tenant=TENANT,
        name="kernel",
        deps=dep_tuples,
        negatives=negs,
        artifact=ArtifactInfo(file=ARTIFACT, size=len(artifact), digest=digest_bytes(artifact)),
        kernels=("kernel",),
        argv=("/usr/bin/cc", "-shared", "-fPIC", "-O2", "-o", "{OUT}", "-x", "c", "{SRC}"),
        toolchain={"compiler": "/usr/bin/cc", "version": "12.2.0", "digest": digest_bytes(b"cc")},
        timings={"compile_s": 0.01},
        created=time.time(),
    )


def _rewrite(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


class DiskTierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="safejit-prop-disk-")
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "sub"))
        for rel, (content, _) in zip(HEADERS, CONTENTS, strict=True):
            _rewrite(os.path.join(src, rel), content)
        self.src = os.path.realpath(src)
        self.anchors = Anchors({"s0": self.src})
        self.disk = DiskTier((os.path.join(self.tmp, "cache"),), tenant=TENANT, backend=BACKEND)
        # As in Runtime: publish goes to the writable root the cache probed.
        root = self.disk.writable_root()
        assert root == self.disk.roots[0]
        self.root = root
        self.model: dict[str, dict[str, Leaf]] = {}
        self.damaged: dict[tuple[str, str], str] = {}  # (build_key, deps_key) -> how
        self.edited: set[int] = set()  # headers whose content is the edited one
        self.shadowed: set[str] = set()  # NEGATIVES that now exist

    def teardown(self) -> None:
        try:
            # The damaged leaves no lookup reached (behind a sound leaf, or
            # outdated) are exactly what the integrity sweep finds and moves aside.
            found = {info.path for info, bad in maintenance.verify_all(self.root, fix=True) if bad is not None}
            assert found == {self.leaf_path(b, d) for b, d in self.damaged}
            assert maintenance.check(self.root) == []
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the model -----------------------------------------------------------
    def leaf_path(self, build_key: str, dkey: str) -> str:
        return os.path.join(self.disk.build_dir(self.root, build_key), f"deps-{dkey}")

    def stale_reason(self, leaf: Leaf) -> str | None:
        """Why the leaf's closure no longer matches the source root (None: it does).

        Dependencies are checked before negatives, as verify does."""
        for _, rel, digest in leaf.deps:
            i = HEADERS.index(rel)
            if digest != digest_bytes(CONTENTS[i][i in self.edited]):
                return "dep_changed"
        if any(rel in self.shadowed for _, rel in leaf.negatives):
            return "dep_shadowed"
        return None

    def hits(self, build_key: str) -> dict[str, Leaf]:
        """Leaves a lookup may return: intact and current."""
        return {
            d: leaf
            for d, leaf in self.model.get(build_key, {}).items()
            if (build_key, d) not in self.damaged and self.stale_reason(leaf) is None
        }

    def expected_reasons(self, build_key: str, dkey: str) -> set[str]:
        """Why verify may reject this leaf now (empty: it must not).

        A broken commit (marker, manifest) is found before anything else; an
        outdated closure and damaged artifact bytes may be found in either order."""
        how = self.damaged.get((build_key, dkey))
        if how == "delete_marker":
            return {"marker"}
        if how in COMMIT_DAMAGE:
            return {"manifest"}
        stale = self.stale_reason(self.model[build_key][dkey])
        return {r for r in (stale, "artifact" if how is not None else None) if r is not None}

    # -- rules ---------------------------------------------------------------
    @initialize(build_key=st.sampled_from(BUILD_KEYS), artifact=st.binary(max_size=64))
    def publish_a_first_leaf(self, build_key: str, artifact: bytes) -> None:
        self.publish(build_key, [0], [NEGATIVES[0]], artifact)

    @rule(
        build_key=st.sampled_from(BUILD_KEYS),
        chosen=st.lists(st.integers(0, len(HEADERS) - 1), unique=True, max_size=2),
        negatives=st.lists(st.sampled_from(NEGATIVES), unique=True, max_size=2),
        artifact=st.binary(max_size=64),
    )
    def publish(self, build_key: str, chosen: list[int], negatives: list[str], artifact: bytes) -> None:
        # A compile only records a negative it did not find.
        negatives = [n for n in negatives if n not in self.shadowed]
        deps, states = [], []
        for i in sorted(chosen):
            path = os.path.join(self.src, HEADERS[i])
            digest, snap = hash_file(path)
            deps.append(("s0", HEADERS[i], digest))
            states.append((path, snap, digest))
        negs = tuple(sorted(("s0", n) for n in negatives))
        absent = tuple(os.path.join(self.src, rel) for _, rel in negs)
        manifest = make_manifest(build_key, tuple(deps), negs, artifact)
        dkey = manifest.deps_key

        built = VerifiedLeaf("", "", manifest, artifact, tuple(states), Negatives(paths=absent))
        leaf, outcome = self.disk.publish(self.root, build_key, built)

        assert leaf.path == self.leaf_path(build_key, dkey)
        assert leaf.manifest.deps_key == dkey
        assert leaf.dep_states == tuple(states)
        held = self.model.setdefault(build_key, {})
        event(f"publish: {outcome}" + (" over a damaged leaf" if (build_key, dkey) in self.damaged else ""))
        if dkey in held and (build_key, dkey) not in self.damaged:
            # An intact leaf already sits there: it is adopted, its bytes win.
            assert outcome == "adopted"
            assert leaf.artifact == held[dkey].artifact
        else:
            # Nothing there, or a damaged leaf (quarantined before publishing over it).
            assert outcome == "published"
            assert leaf.artifact == artifact
            held[dkey] = Leaf(artifact, manifest.deps, manifest.negatives)
            self.damaged.pop((build_key, dkey), None)
        assert not staging_residue(self.root), "publish left its staging directory"

    @rule(build_key=st.sampled_from(BUILD_KEYS))
    def lookup(self, build_key: str) -> None:
        hits = self.hits(build_key)
        on_disk = set(self.model.get(build_key, {}))
        expected = {d: self.expected_reasons(build_key, d) for d in on_disk}
        got, rejections = self.disk.lookup_root(self.root, build_key, self.anchors)

        if got is None:
            assert not hits, "lookup missed although an intact, current leaf exists"
        else:
            dkey = got.manifest.deps_key
            assert dkey in hits, f"lookup returned a leaf that is damaged or outdated ({dkey})"
            assert got.artifact == hits[dkey].artifact
            assert got.path == self.leaf_path(build_key, dkey)
            assert got.manifest.build_key == build_key
            assert got.negatives.paths() == [os.path.join(self.src, rel) for _, rel in hits[dkey].negatives]
            assert [s[2] for s in got.dep_states] == [d for _, _, d in hits[dkey].deps]

        rejected: dict[str, str] = {}
        for r in rejections:
            dkey = os.path.basename(r.leaf).removeprefix("deps-")
            assert dkey in on_disk, r
            assert r.reason in expected[dkey], f"{r} (expected one of {sorted(expected[dkey])})"
            rejected[dkey] = r.reason
        if got is None:
            assert set(rejected) == on_disk, "a miss did not look at every leaf"
        for dkey in on_disk:
            # Damaged and met: quarantined (the root is writable); else in place.
            quarantined = rejected.get(dkey) in CORRUPT_REASONS
            assert os.path.isdir(self.leaf_path(build_key, dkey)) != quarantined
            if quarantined:
                self.damaged.pop((build_key, dkey))
                del self.model[build_key][dkey]
        event(f"lookup: {'miss' if got is None else 'hit'}; rejected {sorted(set(rejected.values()))}")

    @rule(data=st.data(), how=st.sampled_from(COMMIT_DAMAGE + ARTIFACT_DAMAGE))
    def damage(self, data: st.DataObject, how: str) -> None:
        choices = sorted((b, d) for b in self.model for d in self.model[b] if (b, d) not in self.damaged)
        if not choices:
            return
        build_key, dkey = data.draw(st.sampled_from(choices), label="leaf")
        leaf = self.leaf_path(build_key, dkey)
        art, man, marker = (os.path.join(leaf, n) for n in (ARTIFACT, MANIFEST, MARKER))
        good = self.model[build_key][dkey].artifact
        if how == "flip_artifact_byte":
            _rewrite(art, bytes([good[0] ^ 0xFF]) + good[1:] if good else b"\x00")
        elif how == "truncate_artifact":
            _rewrite(art, good[:-1] if good else b"x")
        elif how == "grow_artifact":
            _rewrite(art, good + b"\x00")
        elif how == "delete_artifact":
            os.unlink(art)
        elif how == "edit_manifest":
            with open(man, "ab") as fh:
                fh.write(b" ")
        elif how == "lying_manifest":
            # A manifest consistent with its marker that vouches for other bytes.
            with open(man, "rb") as fh:
                doc = json.load(fh)
            doc["artifact"]["digest"] = digest_bytes(good + b"lie")
            raw = json.dumps(doc, indent=1, sort_keys=True).encode()
            _rewrite(man, raw)
            _rewrite(marker, digest_bytes(raw).encode() + b"\n")
        elif how == "delete_marker":
            os.unlink(marker)
        else:
            _rewrite(marker, b"0" * 64 + b"\n")
        self.damaged[(build_key, dkey)] = how
        # Look it up at once: the damaged leaf must not come back, and if the
        # lookup meets it (nothing newer and sound stands before it) it is quarantined.
        self.lookup(build_key)

    @rule(header=st.integers(0, len(HEADERS) - 1))
    def toggle_header(self, header: int) -> None:
        # Edit a header (or put it back): leaves built against the other
        # content are outdated, not damaged.
        self.edited ^= {header}
        _rewrite(os.path.join(self.src, HEADERS[header]), CONTENTS[header][header in self.edited])

    @rule(rel=st.sampled_from(NEGATIVES))
    def toggle_shadow(self, rel: str) -> None:
        # A header appears where a compile found none (or goes away again).
        path = os.path.join(self.src, rel)
        if rel in self.shadowed:
            os.unlink(path)
        else:
            _rewrite(path, b"#define SHADOW 1\n")
        self.shadowed ^= {rel}

    # -- invariants ----------------------------------------------------------
    @invariant()
    def every_leaf_verifies_as_the_model_says(self) -> None:
        for build_key, leaves in self.model.items():
            for dkey, leaf in leaves.items():
                got = self.disk.verify(self.leaf_path(build_key, dkey), self.root, build_key, self.anchors)
                want = self.expected_reasons(build_key, dkey)
                if not want:
                    assert isinstance(got, VerifiedLeaf), got
                    assert got.artifact == leaf.artifact
                else:
                    assert isinstance(got, Rejection), f"verify passed a leaf that should fail with {sorted(want)}"
                    assert got.reason in want, got

    @invariant()
    def check_reports_exactly_the_damaged_leaves(self) -> None:
        problems = maintenance.check(self.root)
        flagged = {p.split(": ", 1)[0] for p in problems}
        assert flagged == {self.leaf_path(b, d) for b, d in self.damaged}, problems
        on_disk = {(i.build_key, i.deps_key) for i in maintenance.iter_leaves(self.root)}
        assert on_disk == {(b, d) for b in self.model for d in self.model[b]}


TestDiskTier = DiskTierMachine.TestCase
# Every step fsyncs and rescans the cache: fewer runs than the profile's count
# (25 of the ci profile's 40), scaled with it.
TestDiskTier.settings = settings(max_examples=max(10, settings.default.max_examples * 5 // 8), stateful_step_count=25)
