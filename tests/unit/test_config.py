"""Config validates everything it can at construction."""

from __future__ import annotations

import pytest

import safejit

KEY = b"k" * 32


def test_a_short_signing_key_is_refused_by_config():
    with pytest.raises(safejit.ConfigError, match="at least 16"):
        safejit.Config(signing_key=b"short")
    with pytest.raises(safejit.ConfigError):
        safejit.Config(signing_key="a string key, not bytes")  # type: ignore[arg-type]


def test_require_signed_defaults_to_whether_a_key_is_set():
    assert safejit.Config().require_signed is False
    assert safejit.Config(signing_key=KEY).require_signed is True
    assert safejit.Config(signing_key=KEY, require_signed=False).require_signed is False
    with pytest.raises(safejit.ConfigError, match=r"needs Config\.signing_key or Config\.verify_keys"):
        safejit.Config(require_signed=True)


def test_a_key_without_require_signed_reads_unsigned_leaves_and_writes_signed_ones(make_runtime, cache_dir):
    src = safejit.Source("#define V 3\n", "v")
    unsigned = make_runtime(backend="fake")
    unsigned.compile(src)
    mixed = make_runtime(backend="fake", signing_key=KEY, require_signed=False)
    assert mixed.compile(src).artifact.tier == "disk"  # the unsigned leaf is read
    strict = make_runtime(backend="fake", signing_key=KEY)
    assert strict.compile(src).artifact.tier == "compiled"  # not under require_signed: rebuilt, signed
    assert make_runtime(backend="fake", signing_key=KEY).compile(src).artifact.tier == "disk"
    other = make_runtime(backend="fake", signing_key=b"o" * 32, require_signed=False)
    # A signed leaf must verify, whatever require_signed says: another key's is a miss.
    explained = other.explain(src)
    assert explained.result == "miss" and explained.miss == "unknown_key"
    assert other.compile(src).artifact.tier == "compiled"
