"""A leaf: its manifest (the one schema, strict decoder and encoder), its files, and
its verification against the files of THIS machine.

The manifest is hostile input (a shared cache is written by others): it is decoded
by a strict schema (unknown fields, wrong types, deep nesting, out-of-range numbers
are a :class:`ManifestError`, which callers treat as a miss), and a signature covers
every field of it. :func:`verify_closure` is shared by every tier that serves leaves
built elsewhere: it rehashes the listed dependencies (or trusts an unchanged stat this
user recorded, see ``statmemo``) and checks that every negative lookup is still absent.

(Over the style's 400 lines: the manifest and its verification are one contract, what
a leaf claims and how a reader holds it to that, and every tier imports both from here.)
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Protocol

import msgspec

from ..closure.anchors import LINK_ANCHOR, Anchors, is_under
from ..closure.hashing import Snapshot, digest_bytes, hash_opened
from ..closure.scan import Absence, DepState, dirs_unchanged, negative_dirs
from ..outcomes import Miss
from .layout import MANIFEST, MARKER

__all__ = [
    "MANIFEST_SCHEMA",
    "ArtifactInfo",
    "BackendMeta",
    "ClosureMemo",
    "HostSignature",
    "Inputs",
    "Manifest",
    "ManifestError",
    "Rejection",
    "Signature",
    "Signer",
    "VerifiedLeaf",
    "Verifier",
    "decode_manifest",
    "encode_manifest",
    "leaf_files",
    "signed_bytes",
    "verify_closure",
]

MANIFEST_SCHEMA: Final = 2
#: A manifest larger than this is not read (a planted one could be any size).
MANIFEST_LIMIT: Final = 64 << 20

Hex64 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
#: A dependency's digest: 64 characters here, lowercase hex checked by
#: :func:`decode_manifest` for all rows at once (a pattern per row: ~0.75 us each).
Digest64 = Annotated[str, msgspec.Meta(min_length=64, max_length=64)]
Text = Annotated[str, msgspec.Meta(max_length=1 << 16)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]


class ManifestError(ValueError):
    """The manifest does not match the schema."""


class ArtifactInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    file: Annotated[str, msgspec.Meta(pattern=r"^artifact\.[a-z0-9]{1,16}$")]
    size: Count
    digest: Hex64


class Signature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A signature over :func:`signed_bytes`: ``alg`` (``hmac-sha256`` | ``ed25519``),
    the id of the key that made it, and its value (hex)."""

    alg: Annotated[str, msgspec.Meta(max_length=32)]
    key_id: Annotated[str, msgspec.Meta(max_length=128)]
    value: Annotated[str, msgspec.Meta(max_length=512)]


#: A C type as a host call checks it (``backends/_prototypes.py`` says what each code means).
TypeCode = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(v|b|[iu][1248]|c[iu]1|f(2|4|8|12|16)|pc?:(v|b|p|[iu][1248]|c[iu]1|f(2|4|8|12|16)|s\d{1,12})|!.{1,200})$"
    ),
]


class HostSignature(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """A host kernel's C prototype, as the build's debug info describes it: the return
    type's ``(code, spelling)``, each parameter's ``(name, code, spelling)`` (name ""
    when not recorded), and whether it takes ``...``."""

    ret: tuple[TypeCode, Text]
    params: Annotated[tuple[tuple[Text, TypeCode, Text], ...], msgspec.Meta(max_length=4096)]
    varargs: bool = False


class BackendMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a backend keeps beside the bytes (CUDA: parameter layouts ``[(offset, size)]``
    per kernel, and the lowered names of name expressions; host: each kernel's
    signature). A field added here has a default, and one that is not encoded when unset:
    a leaf written before it decodes, and its signature still verifies."""

    params: dict[Text, tuple[tuple[Count, Count], ...]] = {}
    symbols: dict[Text, Text] = {}
    #: UNSET (never encoded) when the backend gives none: a leaf written before the field
    #: existed re-encodes to the very bytes it was signed over, and a CUDA leaf is unchanged.
    signatures: dict[Text, HostSignature] | msgspec.UnsetType = msgspec.UNSET


class Inputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the build key was made of, besides the toolchain (for ``explain`` to say
    which input differs when a request misses). Environment values are kept as
    digests: a passed-through variable may hold what a shared cache must not show."""

    source_digest: Hex64
    language: Text
    arch: Text | None
    flags: tuple[Text, ...]
    defines: tuple[tuple[Text, Text | None], ...]
    include_dirs: tuple[tuple[Text, Text], ...]
    extras: tuple[tuple[Text, Text], ...]
    env: tuple[tuple[Text, Hex64], ...]


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A leaf's manifest. ``deps``: ``(anchor, relpath, digest)`` of every file the build
    read, sorted; ``negatives``: ``(anchor, relpath)`` of paths that must stay absent."""

    schema: int = MANIFEST_SCHEMA
    build_key: Hex64
    deps_key: Hex64
    backend: Text
    tenant: Text
    name: Text
    deps: tuple[tuple[Text, Text, Digest64], ...]
    negatives: tuple[tuple[Text, Text], ...]
    artifact: ArtifactInfo
    kernels: tuple[Text, ...]
    argv: tuple[Text, ...]
    toolchain: dict[Text, Text]
    timings: dict[Text, float]
    created: float
    meta: BackendMeta = BackendMeta()
    inputs: Inputs | None = None
    signature: Signature | None = None

    @property
    def artifact_file(self) -> str:
        return self.artifact.file

    @property
    def artifact_size(self) -> int:
        return self.artifact.size

    @property
    def artifact_digest(self) -> str:
        return self.artifact.digest

    def meta_dict(self) -> dict[str, Any]:
        """The backend metadata as plain values (what a backend's ``load`` takes)."""
        return msgspec.structs.asdict(self.meta)


_DECODER: Final = msgspec.json.Decoder(Manifest)
_ENCODER: Final = msgspec.json.Encoder()


def decode_manifest(raw: bytes) -> Manifest:
    """Decode and validate; any deviation raises :class:`ManifestError`."""
    try:
        man = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ManifestError(str(exc)) from None
    if man.schema != MANIFEST_SCHEMA:
        raise ManifestError(f"schema {man.schema}, expected {MANIFEST_SCHEMA}")
    if not math.isfinite(man.created) or not all(math.isfinite(v) for v in man.timings.values()):
        raise ManifestError("a number is not finite")
    if "".join(map(_DIGEST, man.deps)).translate(_NOT_HEX):
        raise ManifestError("a dependency's digest is not lowercase hex")
    return man


_DIGEST: Final = operator.itemgetter(2)
_NOT_HEX: Final = str.maketrans("", "", "0123456789abcdef")  # (what is left is not hex)


def encode_manifest(man: Manifest) -> bytes:
    return _ENCODER.encode(man)


def signed_bytes(man: Manifest) -> bytes:
    """What a signature covers: every field of the manifest but the signature."""
    return b"safejit.leaf\0" + _ENCODER.encode(msgspec.structs.replace(man, signature=None))


class Signer(Protocol):
    """Signs the leaves this process publishes (``policy.trust``)."""

    @property
    def alg(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    def sign(self, message: bytes) -> str: ...


class Verifier(Protocol):
    """Checks signatures of leaves others published (``policy.trust.SignaturePolicy``).
    ``require`` makes an unsigned leaf a miss; a signed leaf must verify either way.
    ``check`` answers ``ok``, ``bad_signature``, ``unknown_key_id`` or ``unknown_alg``."""

    @property
    def require(self) -> bool: ...

    def check(self, message: bytes, alg: str, key_id: str, value: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a leaf (or a tier) served nothing: a :class:`~safejit.outcomes.Miss`, a
    detail for people (the changed file, the error), the leaf and root concerned."""

    reason: Miss
    detail: str = ""
    leaf: str = ""
    root: str = ""


class Negatives:
    """Paths that must stay absent for a leaf to stay valid (shadowing headers, false
    ``__has_include``), and how to check that cheaply: the deepest existing directory
    above each, with its identity and last change as recorded when the check last
    passed. While such a directory is unchanged no entry was added to it, so every
    absent path below it still is; when one changed (for any entry), the paths are
    checked one by one and the directories recorded again."""

    __slots__ = ("_dirs", "_paths", "_root_of", "_rows")

    def __init__(
        self,
        *,
        paths: Sequence[str] | None = None,
        rows: Sequence[tuple[str, str]] = (),
        anchors: Anchors | None = None,
        dirs: Sequence[tuple[str, Snapshot]] = (),
    ) -> None:
        self._paths = list(paths) if paths is not None else None
        self._rows = rows
        self._root_of = anchors.expand if anchors is not None else None
        self._dirs = list(dirs)

    def __len__(self) -> int:
        return len(self._paths) if self._paths is not None else len(self._rows)

    @property
    def dirs(self) -> list[tuple[str, Snapshot]]:
        return self._dirs

    def paths(self) -> list[str]:
        """The absolute paths (expanded from their anchors on first need). A row that
        no longer expands (its root is not declared here) stands for a path that is
        there: the check fails."""
        if self._paths is None:
            expand = self._root_of
            assert expand is not None
            self._paths = [expand(a, r) or "\0" for a, r in self._rows]
        return self._paths

    def hold(self) -> bool:
        """Whether every path is still absent (re-recording the directories when they
        had to be checked path by path)."""
        if self._dirs and dirs_unchanged(self._dirs):
            return True
        paths = self.paths()
        dirs = None if "\0" in paths else negative_dirs(paths)
        if dirs is None:
            return False
        self._dirs = dirs
        return True

    def first_present(self) -> str:
        """The first path that is there now (for the reason of a miss)."""
        absent = Absence()
        return next((p for p in self.paths() if p == "\0" or not absent(p)), "")


@dataclass(frozen=True, slots=True)
class VerifiedLeaf:
    """A leaf whose every check passed: load ``artifact`` (the verified bytes), never
    the path again. ``path`` is empty for a build that was not published."""

    path: str
    root: str
    manifest: Manifest
    artifact: bytes
    dep_states: tuple[DepState, ...] = field(repr=False)
    negatives: Negatives = field(default_factory=Negatives, repr=False)
    #: False when the compiler's dependency scan was incomplete (never cached beyond one use).
    closure_known: bool = True
    #: When (``_clock.now()``) its closure was last found current: the memory
    #: tier's staleness clock starts here, not when the entry is stored.
    checked: float = 0.0


def leaf_files(man: Manifest, artifact: bytes, signer: Signer | None) -> tuple[Manifest, dict[str, bytes]]:
    """The manifest as published (signed when there is a signer) and the leaf's files,
    ``{name: bytes}`` in write order: the marker, which holds the manifest's digest, last."""
    if signer is not None:
        value = signer.sign(signed_bytes(man))
        man = msgspec.structs.replace(man, signature=Signature(alg=signer.alg, key_id=signer.key_id, value=value))
    raw = encode_manifest(man)
    return man, {man.artifact.file: artifact, MANIFEST: raw, MARKER: digest_bytes(raw).encode() + b"\n"}


def check_signature(man: Manifest, verifier: Verifier | None) -> Rejection | None:
    if verifier is None:
        return None
    sig = man.signature
    if sig is None:
        return Rejection(Miss.UNSIGNED, "the leaf is not signed") if verifier.require else None
    verdict = verifier.check(signed_bytes(man), sig.alg, sig.key_id, sig.value)
    if verdict == "ok":
        return None
    reason = Miss.UNKNOWN_KEY if verdict in ("unknown_key_id", "unknown_alg") else Miss.SIGNATURE
    return Rejection(reason, f"{verdict.replace('_', ' ')} ({sig.alg}, key {sig.key_id!r})")


class ClosureMemo(Protocol):
    """The per-user record of the states a leaf's closure had when it last verified by
    a full check (``cache.statmemo``): an unchanged stat stands for unchanged bytes.
    ``lookup`` compares the dependencies' stats now with those recorded."""

    def lookup(self, leaf: str, deps_key: str, roots: str) -> MemoRecord | None: ...

    def record(self, leaf: str, deps_key: str, roots: str, record: MemoRecord, now: int | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class MemoRecord:
    """Each dependency's path and stat; each negative directory's path and stat. From
    ``ClosureMemo.lookup``, ``snaps`` are the dependencies' stats now, when every one is
    as recorded, and None when one moved or is gone."""

    paths: list[str]
    snaps: list[Snapshot] | None
    dirs: list[tuple[str, Snapshot]]


Rehashed = dict[str, tuple[str, Snapshot] | None]


def verify_closure(
    man: Manifest,
    anchors: Anchors,
    leaf: str,
    memo: ClosureMemo | None,
    rehashed: Rehashed | None = None,
    taken_ns: int | None = None,
) -> tuple[tuple[DepState, ...], Negatives] | Rejection:
    """The dependencies' current states and the negatives, if the closure still holds on
    this machine — every dependency hashes as listed, every negative is absent — else
    why not. With a memo, a dependency whose stat is as this user recorded it after a
    full check is not read again, and negatives below unchanged directories are not
    looked up one by one. ``rehashed``: digests already taken in this lookup (leaves
    of one build key share most of their closure); ``taken_ns``: the wall time before
    the first of them was taken (default: now). A stat is recorded only if it was not
    racy *then*, when its file was read, not when the check ended."""
    taken = time.time_ns() if taken_ns is None else taken_ns
    roots_id = _roots_id(anchors) if memo is not None else ""
    recorded = memo.lookup(leaf, man.deps_key, roots_id) if memo is not None else None
    states = _trusted_deps(man, recorded) if recorded is not None else None
    changed = states is None
    if states is None:
        rehashed = {} if rehashed is None else rehashed
        fresh: list[DepState] = []
        for anchor, rel, want in man.deps:
            state = _rehash(anchors, anchor, rel, rehashed)
            if isinstance(state, Miss) or state[2] != want:
                where = anchors.expand(anchor, rel) or f"{anchor}:{rel}"
                return Rejection(state if isinstance(state, Miss) else Miss.DEP_CHANGED, where)
            fresh.append(state)
        states = tuple(fresh)
    negatives = Negatives(rows=man.negatives, anchors=anchors, dirs=recorded.dirs if recorded is not None else ())
    before = negatives.dirs
    if man.negatives and not negatives.hold():
        return Rejection(Miss.DEP_SHADOWED, negatives.first_present())
    if memo is not None and (changed or negatives.dirs is not before):
        memo.record(
            leaf,
            man.deps_key,
            roots_id,
            MemoRecord([s[0] for s in states], [s[1] for s in states], negatives.dirs),
            now=taken,
        )
    return states, negatives


def _roots_id(anchors: Anchors) -> str:
    """Which roots the anchors name: a memo recorded under other roots says nothing."""
    return digest_bytes("\0".join(f"{k}={v}" for k, v in sorted(anchors.roots.items())).encode())


def _trusted_deps(man: Manifest, recorded: MemoRecord) -> tuple[DepState, ...] | None:
    """The dependencies' states from the memo, when no stat moved since it was recorded."""
    if recorded.snaps is None or len(recorded.paths) != len(man.deps):
        return None
    return tuple(zip(recorded.paths, recorded.snaps, (d[2] for d in man.deps), strict=True))


def _rehash(anchors: Anchors, anchor: str, rel: str, rehashed: Rehashed) -> DepState | Miss:
    """The current state of an anchored dependency, confined to its roots: the file
    it reaches, through any symlink on the way, must lie under one (under the
    linker's roots only for a dep anchored there: the linker's read)."""
    path = anchors.expand(anchor, rel)
    if path is None:
        return Miss.ANCHOR
    linker = anchor.startswith(LINK_ANCHOR)
    key = f"\0{LINK_ANCHOR}{path}" if linker else path
    if key in rehashed:
        got = rehashed[key]
        return Miss.DEP_MISSING if got is None else (path, got[1], got[0])
    roots = [r for n, r in anchors.roots.items() if linker or not n.startswith(LINK_ANCHOR)]
    try:
        hashed = hash_opened(path, _under_any(roots))
    except (OSError, ValueError):  # (ValueError: a name the OS cannot take, from a manifest)
        rehashed[key] = None
        return Miss.DEP_MISSING
    if hashed is None:
        return Miss.CONFINEMENT
    rehashed[key] = hashed
    return (path, hashed[1], hashed[0])


def _under_any(roots: Sequence[str]) -> Callable[[str], bool]:
    return lambda real: any(is_under(real, r) for r in roots)
