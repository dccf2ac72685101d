"""Plain records and helpers of the data path: explanations, manifests, artifacts,
the counters behind ``Runtime.stats()``."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.base import Products
from ..cache.disk import VerifiedLeaf
from ..cache.leaf import Manifest
from ..cache.usage import MAX_SAMPLES
from ..closure.anchors import Anchors
from ..closure.hashing import digest_bytes
from ..closure.scan import Closure
from ..config import Config
from ..errors import KeyDeclarationError
from ..kernel import Artifact
from ..keys import deps_key
from ..spec import BuildSpec, Source
from ..telemetry import ATTR, instruments

__all__ = [
    "REASON_TEXT",
    "Counters",
    "Explanation",
    "artifact_of",
    "extra_text",
    "lookup_metric",
    "make_manifest",
    "name_of",
    "search_dirs",
]

LOG_EVENT_CAP = 8192


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a lookup would hit or miss; ``path`` names the first changed dependency."""

    result: str  # "hit" | "miss"
    reason: str
    build_key: str
    path: str | None = None
    leaf: str | None = None

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.result}: {self.reason}{where} [build {self.build_key[:16]}]"


REASON_TEXT = {
    "dep_changed": "a dependency changed",
    "dep_missing": "a dependency is missing",
    "dep_shadowed": "a new header shadows a dependency",
    "marker": "the leaf is not committed",
    "manifest": "the manifest is damaged",
    "mismatch": "the manifest names another leaf",
    "artifact": "the artifact is missing or damaged",
    "signature": "the leaf is not validly signed",
    "anchor": "a dependency root is not declared here",
    "confinement": "a dependency escapes its root",
}


def name_of(source: Any) -> str:
    return source.name if isinstance(source, Source) else "?"


def extra_text(name: str, value: Any) -> str:
    if isinstance(value, (bool, str, int, float)):
        return json.dumps(value)
    raise KeyDeclarationError(f"extra {name} must be str, int, float or bool, got {type(value).__name__}")


def lookup_metric(tier: str, result: str, reason: str, attrs: Mapping[str, str]) -> None:
    instruments.lookups.add(1, {**attrs, ATTR.TIER: tier, ATTR.RESULT: result, ATTR.REASON: reason})


def search_dirs(spec: BuildSpec, anchors: Anchors) -> list[str]:
    """The include search list the compiler used, in order (quote chain first)."""

    def from_flags(prefix: str) -> list[str]:
        return [anchors.expand_text(f[len(prefix) :]) for f in spec.flags if f.startswith(prefix)]

    # The backends put user flags first, then include_dirs, then the source's -iquote dir.
    dirs = from_flags("-iquote")
    dirs += [anchors.expand(*spec.quote_dir) or ""] if spec.quote_dir else []
    dirs += from_flags("-I") + [anchors.expand(*d) or "" for d in spec.include_dirs]
    dirs += from_flags("-isystem") + list(spec.toolchain.search_dirs) + from_flags("-idirafter")
    return [d for d in dirs if d]


def make_manifest(
    spec: BuildSpec,
    key: str,
    closure: Closure,
    cfg: Config,
    ext: str,
    *,
    artifact: bytes,
    products: Products,
    seconds: float,
) -> Manifest:
    """The leaf's manifest. ``seconds``: the compile's, until the artifact was complete."""
    dep_tuples = tuple(sorted(d.as_tuple() for d in closure.deps))
    negatives = tuple(sorted(closure.negatives))
    return Manifest(
        build_key=key,
        deps_key=deps_key(dep_tuples, negatives),
        backend=cfg.backend,
        tenant=cfg.tenant,
        name=spec.name,
        deps=dep_tuples,
        negatives=negatives,
        artifact_file=f"artifact.{ext}",
        artifact_size=len(artifact),
        artifact_digest=digest_bytes(artifact),
        kernels=products[0],
        argv=spec.argv,
        toolchain={
            "compiler": spec.toolchain.compiler,
            "version": spec.toolchain.version,
            "digest": spec.toolchain.digest,
        },
        timings={"compile_s": round(seconds, 6)},
        created=time.time(),
        meta=products[1],
    )


def artifact_of(leaf: VerifiedLeaf, where: str) -> Artifact:
    man = leaf.manifest
    return Artifact(
        build_key=man.build_key,
        deps_key=man.deps_key,
        path=leaf.path,
        digest=man.artifact_digest,
        size=man.artifact_size,
        kernels=man.kernels,
        source=where,
    )


COUNTERS = ("compiles", "disk_hits", "misses", "stale", "bypass", "published", "adopted", "not_published", "errors")


class Counters:
    """The per-Runtime counters behind ``Runtime.stats()`` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self.compile_seconds: deque[float] = deque(maxlen=MAX_SAMPLES)

    def add(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
