"""Leaf signatures: who may write a leaf, and how a reader checks one.

- :class:`HmacSigner`: HMAC-SHA256 with a shared key. Whoever can verify can also sign,
  so it fits one machine or a group that trusts each other.
- :class:`Ed25519Signer`: holds an Ed25519 private key (a build or warm service); signs.
- :class:`Verifier`: holds Ed25519 *public* keys (and, if given, HMAC keys) by key id;
  answers :meth:`Verifier.check` with a :data:`Verdict`. It has no ``sign``: an inference
  node given only public keys cannot forge a leaf.

Signatures are lowercase hex. A signed manifest names its ``signature_alg``
(:data:`ALG_HMAC` or :data:`ALG_ED25519`) and ``key_id``; a manifest from before key
ids (HMAC, no key id) is checked against every HMAC key the verifier holds.

>>> signer = Ed25519Signer.generate(key_id="builder-1")
>>> sig = signer.sign(b"leaf")
>>> verifier = Verifier({"builder-1": signer.public_key})
>>> verifier.check(b"leaf", sig, alg=ALG_ED25519, key_id="builder-1")
'ok'
>>> verifier.check(b"leaf", sig, alg=ALG_ED25519, key_id="someone-else")
'unknown_key_id'

``cryptography`` is imported when an Ed25519 key is used, never by ``import safejit``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, Protocol

from ..errors import ConfigError

__all__ = [
    "ALGS",
    "ALG_ED25519",
    "ALG_HMAC",
    "MIN_KEY_BYTES",
    "Ed25519Signer",
    "HmacSigner",
    "SignaturePolicy",
    "Signer",
    "Verdict",
    "Verifier",
    "check_hmac_key",
    "config_policy",
    "load_public_key",
    "public_key_id",
    "signature_policy",
    "signer_of",
]

MIN_KEY_BYTES: Final = 16

ALG_HMAC: Final = "hmac-sha256"
ALG_ED25519: Final = "ed25519"
ALGS: Final = (ALG_HMAC, ALG_ED25519)
#: ``ok``; ``bad_signature`` (malformed, or does not verify under the named key);
#: ``unknown_key_id`` (no key of that id, or no key id where one is needed);
#: ``unknown_alg`` (an algorithm this verifier does not know).
Verdict = Literal["ok", "bad_signature", "unknown_key_id", "unknown_alg"]
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}\Z")
_ED25519_SIG_HEX: Final = 128


class Signer(Protocol):
    """What a publisher signs with (``disk`` needs ``sign`` and ``verify``; a manifest
    records ``alg`` and ``key_id``)."""

    @property
    def alg(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    def sign(self, message: bytes) -> str: ...
    def verify(self, message: bytes, signature: str) -> bool: ...


def check_hmac_key(key: object) -> bytes:
    """``key`` if it can serve as an HMAC signing key, else :class:`ConfigError`."""
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"Config.signing_key must be bytes, at least {MIN_KEY_BYTES} of them (or an Ed25519 PEM)")
    return key


def _check_key_id(key_id: str) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise ConfigError(f"a key id must match {_KEY_ID.pattern}, got {key_id!r:.80}")
    return key_id


class HmacSigner:
    """HMAC-SHA256 over the signed message. ``key_id`` defaults to one derived from the
    key (a MAC of a constant: it reveals no more than any signature does)."""

    alg: Final = ALG_HMAC

    def __init__(self, key: bytes, key_id: str | None = None) -> None:
        self._key = check_hmac_key(key)
        derived = "hmac-" + hmac.new(key, b"safejit key id", hashlib.sha256).hexdigest()[:16]
        self.key_id = _check_key_id(key_id) if key_id is not None else derived

    def sign(self, message: bytes) -> str:
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        # (compare_digest raises on a str with a character past ASCII: such a value, as
        # anyone who can write a leaf may plant, is a bad signature, never an exception)
        return isinstance(signature, str) and signature.isascii() and hmac.compare_digest(self.sign(message), signature)

    def __repr__(self) -> str:
        return f"HmacSigner(key_id={self.key_id!r})"


def public_key_id(public_key: bytes) -> str:
    """The default key id of an Ed25519 public key: ``ed25519-`` and 16 hex digits of its SHA-256."""
    return "ed25519-" + hashlib.sha256(public_key).hexdigest()[:16]


def load_public_key(material: bytes | str) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as raw bytes, hex, base64, PEM
    (SubjectPublicKeyInfo) or an OpenSSH ``ssh-ed25519 AAAA...`` line."""
    if isinstance(material, bytes) and len(material) == 32:
        return material
    if not isinstance(material, (bytes, str)):
        raise ConfigError(f"a public key must be bytes or str, got {type(material).__name__}")
    text = material.decode("ascii", "replace") if isinstance(material, bytes) else material
    text = text.strip()
    if "BEGIN PUBLIC KEY" in text or text.startswith("ssh-ed25519 "):
        return _raw_public(_cryptography_public(text))
    for decode in (bytes.fromhex, base64.b64decode):
        try:
            raw = decode(text)
        except (ValueError, binascii.Error):
            continue
        if len(raw) == 32:
            return raw
    raise ConfigError("an Ed25519 public key must be 32 bytes (raw, hex or base64), PEM or an ssh-ed25519 line")


def _cryptography_public(text: str) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key: Any
    try:
        if text.startswith("ssh-ed25519 "):
            key = serialization.load_ssh_public_key(text.encode())
        else:
            key = serialization.load_pem_public_key(text.encode())
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the Ed25519 public key does not parse: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError("the public key is not an Ed25519 key")
    return key


def _raw_public(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    raw: bytes = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


class Ed25519Signer:
    """Signs with an Ed25519 private key: 32 raw bytes (the seed) or a PKCS#8 PEM."""

    alg: Final = ALG_ED25519

    def __init__(self, private_key: bytes | str, key_id: str | None = None) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if isinstance(private_key, bytes) and len(private_key) == 32:
            key = Ed25519PrivateKey.from_private_bytes(private_key)
        else:
            pem = private_key.encode() if isinstance(private_key, str) else private_key
            try:
                loaded = serialization.load_pem_private_key(pem, password=None)
            except TypeError:  # (its words say no more than this: never a byte of the key)
                raise ConfigError("the Ed25519 private key is encrypted: give it unencrypted (PKCS#8 PEM)") from None
            except ValueError:
                raise ConfigError(
                    "the Ed25519 private key does not parse: a PKCS#8 PEM private key is wanted (not a public key)"
                ) from None
            if not isinstance(loaded, Ed25519PrivateKey):
                raise ConfigError("the private key is not an Ed25519 key")
            key = loaded
        self._key = key
        self._public = key.public_key()
        self.public_key: bytes = _raw_public(self._public)
        self.key_id = _check_key_id(key_id) if key_id is not None else public_key_id(self.public_key)

    @classmethod
    def generate(cls, key_id: str | None = None) -> Ed25519Signer:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        seed = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return cls(seed, key_id)

    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (to store in a secret manager)."""
        from cryptography.hazmat.primitives import serialization

        pem: bytes = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return pem

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        pem: bytes = self._public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem

    def sign(self, message: bytes) -> str:
        return bytes(self._key.sign(message)).hex()

    def verify(self, message: bytes, signature: str) -> bool:
        return _ed25519_ok(self._public, message, signature)

    def verifier(self) -> Verifier:
        """A verifier holding only this signer's public key."""
        return Verifier({self.key_id: self.public_key})

    def __repr__(self) -> str:
        return f"Ed25519Signer(key_id={self.key_id!r})"


def _ed25519_ok(public: Any, message: bytes, signature: str) -> bool:
    from cryptography.exceptions import InvalidSignature

    if not isinstance(signature, str) or len(signature) != _ED25519_SIG_HEX:
        return False
    try:
        raw = bytes.fromhex(signature)
    except ValueError:
        return False
    try:
        public.verify(raw, message)
    except InvalidSignature:
        return False
    return True


class Verifier:
    """Checks signatures; holds public keys (and optional HMAC keys) by key id. It cannot sign."""

    def __init__(
        self, public_keys: Mapping[str, bytes | str] | None = None, *, hmac: Iterable[HmacSigner] = ()
    ) -> None:
        self._ed25519: dict[str, Any] = {}
        if public_keys:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            for key_id, material in public_keys.items():
                raw = load_public_key(material)
                self._ed25519[_check_key_id(key_id)] = Ed25519PublicKey.from_public_bytes(raw)
        self._hmac: dict[str, HmacSigner] = {}
        for signer in hmac:
            if not isinstance(signer, HmacSigner):
                raise ConfigError("Verifier(hmac=...) takes HmacSigner objects")
            self._hmac[signer.key_id] = signer

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._ed25519) | frozenset(self._hmac)

    def check(self, message: bytes, signature: str, *, alg: str = ALG_HMAC, key_id: str | None = None) -> Verdict:
        """Whether ``signature`` over ``message`` verifies under the key ``key_id`` of ``alg``."""
        if alg == ALG_ED25519:
            public = self._ed25519.get(key_id) if key_id is not None else None
            if public is None:
                return "unknown_key_id"
            return "ok" if _ed25519_ok(public, message, signature) else "bad_signature"
        if alg == ALG_HMAC:
            if key_id is None:  # a manifest from before key ids
                if not self._hmac:
                    return "unknown_key_id"
                ok = any(s.verify(message, signature) for s in self._hmac.values())
                return "ok" if ok else "bad_signature"
            signer = self._hmac.get(key_id)
            if signer is None:
                return "unknown_key_id"
            return "ok" if signer.verify(message, signature) else "bad_signature"
        return "unknown_alg"

    def __repr__(self) -> str:
        return f"Verifier(key_ids={sorted(self.key_ids)!r})"


def signer_of(key: bytes | str) -> HmacSigner | Ed25519Signer:
    """The signer a ``Config.signing_key`` stands for: an Ed25519 private key given as
    PEM (PKCS#8), else an HMAC key (bytes, at least 16)."""
    if not isinstance(key, (bytes, str)):
        raise ConfigError(f"Config.signing_key must be bytes or str, got {type(key).__name__}")
    text = key.decode("ascii", "replace") if isinstance(key, bytes) else key
    if "-----BEGIN" in text:
        return Ed25519Signer(key)
    if isinstance(key, str):
        raise ConfigError("Config.signing_key must be bytes (HMAC) or an Ed25519 private key in PEM")
    return HmacSigner(key)


class SignaturePolicy:
    """How leaves are checked: by ``verifier``'s keys; ``require``: an unsigned leaf is a
    miss (a signed one must verify either way). Answers with a :data:`Verdict`."""

    def __init__(self, verifier: Verifier, *, require: bool) -> None:
        self.verifier = verifier
        self._require = require

    @property
    def require(self) -> bool:
        return self._require

    def check(self, message: bytes, alg: str, key_id: str, value: str) -> Verdict:
        return self.verifier.check(message, value, alg=alg, key_id=key_id or None)


def signature_policy(
    verify_keys: Iterable[tuple[str, bytes | str]], signer: object, *, require: bool
) -> SignaturePolicy | None:
    """What a leaf's signature is checked against: the HMAC key ``signer`` holds, the
    Ed25519 public key of ``signer``, and ``verify_keys`` (public keys by key id). None
    when there is no key at all and ``require`` is false: nothing to check."""
    publics = dict(verify_keys)
    hmacs = [signer] if isinstance(signer, HmacSigner) else []
    own = getattr(signer, "public_key", None)
    if isinstance(own, bytes):
        publics.setdefault(getattr(signer, "key_id", ""), own)
    if not publics and not hmacs and not require:
        return None
    return SignaturePolicy(Verifier(publics, hmac=hmacs), require=require)


def config_policy(config: Any, signer: object | None = None) -> SignaturePolicy | None:
    """The signature policy a ``safejit.Config`` sets: its ``verify_keys``, its signing
    key's own (``signer``, else made from ``config.signing_key``), ``require_signed``."""
    if signer is None and config.signing_key:
        signer = signer_of(config.signing_key)
    return signature_policy(config.verify_keys, signer, require=bool(config.require_signed))
