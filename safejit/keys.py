"""Canonical encoding and the two keys.

The encoding is versioned and length-framed: every value is a one-byte type
tag, an 8-byte big-endian length and the payload, so no two different values
encode alike. Sets and dicts are refused: their iteration order must never
reach a hash. The two keys — a closure's rows (thousands, hashed on every disk
lookup) and a build spec (hundreds of values, encoded again in every new process) —
are encoded as MessagePack instead, in one C call: as typed and length-prefixed.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from .closure.hashing import digest_bytes
from .spec import NOT_IN_KEY, TOOLCHAIN_NOT_IN_KEY, BuildSpec, Toolchain

__all__ = ["KEY_SCHEMA", "build_key", "deps_encoding", "deps_key", "encode"]

KEY_SCHEMA: Final = 4  # 2: the closure is encoded as MessagePack; 3: the build key too; 4: closures the
# preprocessor's recorded lookups vouch for (leaves vouched for by reading the sources alone go)
_LEN = struct.Struct(">Q")


def _frame(tag: bytes, payload: bytes) -> bytes:
    return tag + _LEN.pack(len(payload)) + payload


def encode(value: object) -> bytes:
    """Typed, length-framed, order-preserving encoding of plain values."""
    if value is None:
        return _frame(b"N", b"")
    if isinstance(value, bool):
        return _frame(b"B", b"1" if value else b"0")
    if isinstance(value, int):
        return _frame(b"I", str(value).encode())
    if isinstance(value, float):
        return _frame(b"F", value.hex().encode())
    if isinstance(value, str):
        return _frame(b"S", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _frame(b"Y", bytes(value))
    if isinstance(value, (tuple, list)):
        return _frame(b"T", b"".join(encode(v) for v in value))
    if type(value) is Toolchain:
        return _encode_toolchain(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode_dataclass(value)
    raise TypeError(f"{type(value).__name__} cannot enter a key (unordered or unknown type)")


def _encode_dataclass(value: Any) -> bytes:
    items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return _frame(b"D", encode((type(value).__name__, items)))


_KEY = msgspec.msgpack.Encoder()


def build_key(spec: BuildSpec) -> str:
    """Hash of every BuildSpec field not in ``NOT_IN_KEY``. Portable: the toolchain's
    install prefix enters it as a token (:func:`portable`), in the toolchain and argv.

    MessagePack (typed and length-prefixed), in one C call: a spec's fields are text,
    ints, None and tuples of these (their types, checked by mypy, are all it holds: no
    dict or set reaches a key), and the toolchain as :func:`_toolchain_msgpack` gives it."""
    prefix = install_prefix(spec.toolchain)
    fields: list[tuple[str, Any]] = []
    for name in _KEY_FIELDS:
        value = getattr(spec, name)
        if name == "toolchain":
            value = msgspec.Raw(_toolchain_msgpack(value))
        elif name == "argv":
            value = portable(value, prefix)
        fields.append((name, value))
    return digest_bytes(_KEY.encode(("safejit.build_key", KEY_SCHEMA, fields)))


_KEY_FIELDS: Final = tuple(f.name for f in dataclasses.fields(BuildSpec) if f.name not in NOT_IN_KEY)


_PREFIX_MARK: Final = "{toolchain-prefix}"


def install_prefix(tc: Toolchain) -> str:
    """Where ``tc`` is installed: its declared prefix, else its compiler's ``../..``."""
    return tc.prefix or os.path.dirname(os.path.dirname(tc.compiler)) or "/"


def portable(value: Any, prefix: str) -> Any:
    """``value`` (a path, or a tuple of them) with a leading ``prefix`` as a token."""
    if isinstance(value, tuple):
        return tuple(portable(v, prefix) for v in value)
    if isinstance(value, str) and prefix not in ("", "/") and (value == prefix or value.startswith(prefix + "/")):
        return _PREFIX_MARK + value[len(prefix) :]
    return value


_ENCODED: dict[Any, bytes] = {}
_TOOLCHAIN = msgspec.msgpack.Encoder()


def _encode_toolchain(value: Toolchain) -> bytes:
    """:func:`encode` of a toolchain: its MessagePack (:func:`_toolchain_msgpack`), tagged ``M``."""
    return _frame(b"M", _toolchain_msgpack(value))


def _toolchain_msgpack(value: Toolchain) -> bytes:
    """A toolchain's encoding, computed once per (frozen, hashable) Toolchain: it is the
    same for every compile, and its version text and roots are the bulk of a key. Paths
    under its install prefix are encoded relative to it; the prefix itself is not
    encoded (its binaries' digests and version text say which toolchain it is).

    MessagePack: its fields are text, tuples of text, booleans, ints and a
    :class:`~safejit.spec.LoadBaseline` of ints and text (a map in field order), all
    typed and length-prefixed; ~0.15 ms less than :func:`encode` in a new process."""
    found = _ENCODED.get(value)
    if found is None:
        if len(_ENCODED) >= 256:
            _ENCODED.clear()
        prefix = install_prefix(value)
        items = [
            (f.name, portable(getattr(value, f.name), prefix))
            for f in dataclasses.fields(value)
            if f.name not in TOOLCHAIN_NOT_IN_KEY
        ]
        found = _ENCODED[value] = _TOOLCHAIN.encode((type(value).__name__, items))
    return found


_ROWS = msgspec.msgpack.Encoder()


def deps_encoding(deps: Iterable[tuple[str, str, str]], negatives: Iterable[tuple[str, str]] = ()) -> bytes:
    """The bytes :func:`deps_key` hashes: the sorted rows as MessagePack (typed and
    length-prefixed, so it decodes back to exactly these rows: no two closures encode
    alike). One C call for thousands of rows, where a Python loop cost ~3 µs a row."""
    return _ROWS.encode(("safejit.deps_key", KEY_SCHEMA, sorted(map(tuple, deps)), sorted(map(tuple, negatives))))


def deps_key(deps: Iterable[tuple[str, str, str]], negatives: Iterable[tuple[str, str]] = ()) -> str:
    """Hash of the sorted ``(anchor, relpath, digest)`` closure and negative lookups.

    A path that is not valid UTF-8 text cannot be in a closure (nor in a manifest):
    it is a :class:`UnicodeEncodeError` here.
    """
    return digest_bytes(deps_encoding(deps, negatives))
