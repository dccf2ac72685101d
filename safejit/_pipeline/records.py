"""Plain records of the data path: explanations, manifests, artifacts, and the
counters behind ``Runtime.stats()``."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec

from .. import _forksafe
from ..backends.base import Products
from ..cache.leaf import ArtifactInfo, BackendMeta, Inputs, Manifest, VerifiedLeaf
from ..cache.usage import MAX_SAMPLES
from ..closure.anchors import Anchors
from ..closure.hashing import digest_bytes
from ..closure.scan import Closure
from ..errors import KeyDeclarationError
from ..kernel import Artifact
from ..keys import deps_key
from ..outcomes import Miss, Outcome, Tier
from ..spec import BuildSpec, Source

if TYPE_CHECKING:
    from .nearest import Nearest

__all__ = [
    "LOG_EVENT_CAP",
    "Counters",
    "Explanation",
    "HeldCounts",
    "artifact_of",
    "backend_meta",
    "extra_text",
    "make_manifest",
    "name_of",
    "search_dirs",
]

LOG_EVENT_CAP: Final = 8192


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a lookup would hit or miss: ``result`` is ``hit`` or ``miss``, ``reason``
    says why in words, ``miss`` names it (a :class:`~safejit.outcomes.Miss`; None on a
    hit), ``path`` is the first changed dependency or shadowing header, ``leaf`` the
    leaf concerned. When no leaf has the build key (``absent``), ``nearest`` is the
    other build of the kernel whose inputs differ least, and what differs (None when
    there is none)."""

    result: str
    reason: str
    build_key: str
    path: str | None = None
    leaf: str | None = None
    miss: Miss | None = None
    nearest: Nearest | None = None

    @classmethod
    def of(
        cls,
        miss: Miss | None,
        build_key: str,
        *,
        path: str | None = None,
        leaf: str | None = None,
        nearest: Nearest | None = None,
    ) -> Explanation:
        if miss is None:
            return cls("hit", "a leaf verifies", build_key, path, leaf)
        return cls("miss", miss.text, build_key, path, leaf, miss, nearest)

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        differs = ""
        if self.nearest is not None:
            # (another build's manifest says these, unverified: its control characters escaped)
            differs = f"; the nearest build {self.nearest.id} differs in: " + "; ".join(
                _printable(d.detail) for d in self.nearest.differs
            )
        return f"{self.result}: {self.reason}{where} [build {self.build_key[:16]}]{differs}"


def _printable(text: str) -> str:
    """``text`` with each control character (a newline, an escape sequence) escaped."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def name_of(source: Any) -> str:
    return source.name if isinstance(source, Source) else "?"


def extra_text(name: str, value: Any) -> str:
    if isinstance(value, (bool, str, int, float)):
        try:
            return json.dumps(value)
        except ValueError:  # (an int past Python's limit on digits written)
            raise KeyDeclarationError(f"extra {name} is an int too large to write") from None
    raise KeyDeclarationError(f"extra {name} must be str, int, float or bool, got {type(value).__name__}")


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
    spec: BuildSpec, key: str, closure: Closure, ext: str, *, artifact: bytes, products: Products, seconds: float
) -> Manifest:
    """The leaf's manifest. ``seconds``: the compile's, until the artifact was complete."""
    dep_tuples = tuple(sorted(d.as_tuple() for d in closure.deps))
    negatives = tuple(sorted(closure.negatives))
    return Manifest(
        build_key=key,
        deps_key=deps_key(dep_tuples, negatives),
        backend=spec.backend.partition("/")[0],
        tenant=spec.tenant,
        name=spec.name,
        deps=dep_tuples,
        negatives=negatives,
        artifact=ArtifactInfo(file=f"artifact.{ext}", size=len(artifact), digest=digest_bytes(artifact)),
        kernels=products[0],
        argv=spec.argv,
        toolchain={
            "compiler": spec.toolchain.compiler,
            "version": spec.toolchain.version,
            "digest": spec.toolchain.digest,
        },
        timings={"compile_s": round(seconds, 6)},
        created=time.time(),
        meta=backend_meta(products[1]),
        inputs=Inputs(
            source_digest=spec.source_digest,
            language=spec.language,
            arch=spec.arch,
            flags=spec.flags,
            defines=spec.defines,
            include_dirs=spec.include_dirs,
            extras=spec.extras,
            env=tuple((name, digest_bytes(value.encode())) for name, value in spec.env),
        ),
    )


def backend_meta(meta: Mapping[str, Any]) -> BackendMeta:
    """A backend's metadata as the manifest keeps it."""
    return msgspec.convert(meta, BackendMeta)


def artifact_of(leaf: VerifiedLeaf, tier: Tier) -> Artifact:
    man = leaf.manifest
    return Artifact(
        build_key=man.build_key,
        deps_key=man.deps_key,
        path=leaf.path,
        digest=man.artifact_digest,
        size=man.artifact_size,
        kernels=man.kernels,
        tier=tier,
    )


#: What ``Runtime.stats()`` counts besides the memory tier's own figures.
COUNTERS: Final = (
    "compiles",
    "disk_hits",
    "remote_hits",
    "misses",
    Miss.STALE.value,
    Tier.BYPASS.value,
    Outcome.PUBLISHED.value,
    Outcome.ADOPTED.value,
    "not_published",
    "errors",
)


class Counters:
    """The per-Runtime counters behind ``Runtime.stats()`` (thread-safe)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """All zero (a forked child's: its parent's lock may be held for good there, and
        its counts are the parent's)."""
        self._lock = _forksafe.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self.compile_seconds: deque[float] = deque(maxlen=MAX_SAMPLES)

    def add(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def outcome(self, outcome: Outcome) -> None:
        """Count what a publish did (``kept``/``skipped`` are both "not published")."""
        self.add(outcome.value if outcome in (Outcome.PUBLISHED, Outcome.ADOPTED) else "not_published")

    @staticmethod
    def merged(mapping: Mapping[str, int], **more: int) -> dict[str, int]:
        return {**mapping, **more}


class HeldCounts(Counters):
    """Counts held back from ``counters`` until :meth:`keep` (an attempt that is made
    again counts only as the one made again; its compile times go through)."""

    def __init__(self, counters: Counters) -> None:  # (no reset: nothing of its own but what it holds)
        self._counters = counters
        self._held: list[str] = []
        self.compile_seconds = counters.compile_seconds

    def add(self, name: str) -> None:
        self._held.append(name)

    def keep(self) -> None:
        for name in self._held:
            self._counters.add(name)
        self._held.clear()
