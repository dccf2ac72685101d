"""Leaf signatures: HMAC-SHA256 over the leaf name, artifact digest and deps."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["HmacSigner"]


class HmacSigner:
    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) < 16:
            from ..errors import ConfigError

            raise ConfigError("Config.signing_key must be at least 16 bytes")
        self._key = key

    def sign(self, message: bytes) -> str:
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        return hmac.compare_digest(self.sign(message), signature)
