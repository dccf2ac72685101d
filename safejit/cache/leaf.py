"""The leaf manifest: its strict schema and canonical bytes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from ..keys import encode

__all__ = ["MANIFEST_SCHEMA", "Manifest", "ManifestError", "parse_manifest"]

MANIFEST_SCHEMA: Final = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEXES = re.compile(r"[0-9a-f]*")


class ManifestError(ValueError):
    """The manifest does not match the schema."""


@dataclass(frozen=True, slots=True)
class Manifest:
    build_key: str
    deps_key: str
    backend: str
    tenant: str
    name: str
    deps: tuple[tuple[str, str, str], ...]
    negatives: tuple[tuple[str, str], ...]
    artifact_file: str
    artifact_size: int
    artifact_digest: str
    kernels: tuple[str, ...]
    argv: tuple[str, ...]
    toolchain: dict[str, Any]
    timings: dict[str, float]
    created: float
    signature: str | None = None
    #: Backend metadata (CUDA: kernel parameter layouts and lowered names).
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        data = {
            "schema": MANIFEST_SCHEMA,
            "build_key": self.build_key,
            "deps_key": self.deps_key,
            "backend": self.backend,
            "tenant": self.tenant,
            "name": self.name,
            "deps": [list(d) for d in self.deps],
            "negatives": [list(n) for n in self.negatives],
            "artifact": {"file": self.artifact_file, "size": self.artifact_size, "digest": self.artifact_digest},
            "kernels": list(self.kernels),
            "argv": list(self.argv),
            "toolchain": self.toolchain,
            "timings": self.timings,
            "created": self.created,
            "signature": self.signature,
            "meta": self.meta,
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def signed_message(self, leaf_name: str) -> bytes:
        """What a signature covers: leaf name, artifact digest, dependencies and metadata."""
        return encode(
            (
                "safejit.leaf",
                leaf_name,
                self.artifact_digest,
                self.artifact_size,
                sorted(self.deps),
                sorted(self.negatives),
                json.dumps(self.meta, sort_keys=True),
            )
        )


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def _dep_rows(rows: Any) -> bool:
    """``[[anchor, relpath, digest], ...]`` — checked in bulk: closures are large."""
    if not isinstance(rows, list):
        return False
    if not all(
        type(r) is list
        and len(r) == 3
        and type(r[0]) is str
        and type(r[1]) is str
        and type(r[2]) is str
        and len(r[2]) == 64
        for r in rows
    ):
        return False
    return _HEXES.fullmatch("".join(r[2] for r in rows)) is not None


def _str_tuple(value: Any, width: int) -> bool:
    return isinstance(value, list) and len(value) == width and all(isinstance(v, str) for v in value)


def parse_manifest(raw: bytes) -> Manifest:
    """Parse and validate; any deviation raises :class:`ManifestError`."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ManifestError("wrong schema")
    art = data.get("artifact")
    checks = (
        _hex64(data.get("build_key")),
        _hex64(data.get("deps_key")),
        isinstance(data.get("backend"), str),
        isinstance(data.get("tenant"), str),
        isinstance(data.get("name"), str),
        _dep_rows(data.get("deps")),
        isinstance(data.get("negatives"), list) and all(_str_tuple(n, 2) for n in data["negatives"]),
        isinstance(art, dict)
        and isinstance(art.get("file"), str)
        and "/" not in art.get("file", "/")
        and type(art.get("size")) is int
        and art["size"] >= 0
        and _hex64(art.get("digest")),
        isinstance(data.get("kernels"), list) and all(isinstance(k, str) for k in data["kernels"]),
        isinstance(data.get("argv"), list) and all(isinstance(a, str) for a in data["argv"]),
        isinstance(data.get("toolchain"), dict),
        isinstance(data.get("timings"), dict),
        isinstance(data.get("created"), (int, float)),
        "signature" in data and (data["signature"] is None or isinstance(data["signature"], str)),
        isinstance(data.get("meta", {}), dict),
    )
    if not all(checks) or not isinstance(art, dict):
        raise ManifestError("a field is missing or has the wrong type")
    return Manifest(
        build_key=data["build_key"],
        deps_key=data["deps_key"],
        backend=data["backend"],
        tenant=data["tenant"],
        name=data["name"],
        deps=tuple((d[0], d[1], d[2]) for d in data["deps"]),
        negatives=tuple((n[0], n[1]) for n in data["negatives"]),
        artifact_file=art["file"],
        artifact_size=art["size"],
        artifact_digest=art["digest"],
        kernels=tuple(data["kernels"]),
        argv=tuple(data["argv"]),
        toolchain=data["toolchain"],
        timings=data["timings"],
        created=float(data["created"]),
        signature=data["signature"],
        meta=data.get("meta", {}),
    )
