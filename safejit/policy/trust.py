"""Leaf signatures: a signature covers every field of a leaf's manifest
(``cache.leaf.signed_bytes``), so neither the artifact nor what it was built from
nor what the loader is told about it can be swapped under it.

HMAC-SHA256 (``Config.signing_key``): whoever can verify can also sign.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from ..cache.leaf import Signature
from ..errors import ConfigError

__all__ = ["HMAC_ALG", "MIN_KEY_BYTES", "HmacSigner", "HmacVerifier", "check_hmac_key"]

HMAC_ALG = "hmac-sha256"
MIN_KEY_BYTES = 16


def check_hmac_key(key: object) -> bytes:
    """``key`` if it can serve as an HMAC signing key, else :class:`ConfigError`."""
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"Config.signing_key must be bytes, at least {MIN_KEY_BYTES} of them")
    return key


class HmacSigner:
    """Signs with an HMAC key; its key id names the key without revealing it."""

    def __init__(self, key: bytes) -> None:
        self._key = check_hmac_key(key)
        self.key_id = "hmac:" + hashlib.blake2b(key, digest_size=8, person=b"safejit.keyid").hexdigest()

    def sign(self, message: bytes) -> Signature:
        value = hmac.new(self._key, message, hashlib.sha256).hexdigest()
        return Signature(alg=HMAC_ALG, key_id=self.key_id, value=value)

    def verifier(self, *, require: bool) -> HmacVerifier:
        return HmacVerifier(self, require)


@dataclass(frozen=True, slots=True)
class HmacVerifier:
    """Accepts leaves signed with the same HMAC key; ``require``: unsigned leaves are misses."""

    signer: HmacSigner
    require: bool

    def verify(self, message: bytes, signature: Signature) -> bool:
        if signature.alg != HMAC_ALG or signature.key_id != self.signer.key_id:
            return False
        return hmac.compare_digest(self.signer.sign(message).value, signature.value)
