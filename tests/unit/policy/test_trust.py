"""Signatures: Ed25519 signers and public-key verifiers (with key ids), HMAC kept."""

from __future__ import annotations

import base64

import pytest

from safejit.cache.disk import Signer as DiskSigner
from safejit.errors import ConfigError
from safejit.policy.trust import (
    ALG_ED25519,
    ALG_HMAC,
    Ed25519Signer,
    HmacSigner,
    Signer,
    Verifier,
    load_public_key,
    public_key_id,
)

MESSAGE = b"build-K/deps-D\nartifact digest\n"
SEED = bytes(range(32))


def test_ed25519_signature_verifies_with_the_public_key_only():
    signer = Ed25519Signer(SEED, key_id="builder-1")
    sig = signer.sign(MESSAGE)
    assert len(sig) == 128 and int(sig, 16) >= 0
    verifier = Verifier({"builder-1": signer.public_key})
    assert verifier.check(MESSAGE, sig, alg=ALG_ED25519, key_id="builder-1") == "ok"
    assert not hasattr(verifier, "sign")


def test_ed25519_signature_is_deterministic_and_bound_to_the_message():
    signer = Ed25519Signer(SEED)
    assert signer.sign(MESSAGE) == Ed25519Signer(SEED).sign(MESSAGE)
    verifier = signer.verifier()
    assert verifier.check(MESSAGE + b"x", signer.sign(MESSAGE), alg=ALG_ED25519, key_id=signer.key_id) == (
        "bad_signature"
    )


def test_unknown_key_id_is_told_apart_from_a_bad_signature():
    signer = Ed25519Signer(SEED, key_id="builder-1")
    other = Ed25519Signer.generate(key_id="builder-2")
    verifier = Verifier({"builder-1": signer.public_key})
    sig = other.sign(MESSAGE)
    assert verifier.check(MESSAGE, sig, alg=ALG_ED25519, key_id="builder-2") == "unknown_key_id"
    assert verifier.check(MESSAGE, sig, alg=ALG_ED25519, key_id="builder-1") == "bad_signature"
    assert verifier.check(MESSAGE, sig, alg=ALG_ED25519, key_id=None) == "unknown_key_id"


@pytest.mark.parametrize("sig", ["", "zz" * 64, "ab" * 63, "ab" * 65, "AB" * 64 + " "])
def test_malformed_ed25519_signature_is_a_bad_signature(sig):
    signer = Ed25519Signer(SEED, key_id="k")
    assert signer.verifier().check(MESSAGE, sig, alg=ALG_ED25519, key_id="k") == "bad_signature"
    assert signer.verify(MESSAGE, sig) is False


def test_unknown_algorithm():
    assert Verifier().check(MESSAGE, "00", alg="rsa-pss", key_id="k") == "unknown_alg"


def test_hmac_still_accepted_with_and_without_key_id():
    hmac_signer = HmacSigner(b"k" * 32)
    sig = hmac_signer.sign(MESSAGE)
    verifier = Verifier(hmac=[hmac_signer])
    assert verifier.check(MESSAGE, sig, alg=ALG_HMAC, key_id=hmac_signer.key_id) == "ok"
    assert verifier.check(MESSAGE, sig) == "ok"  # a manifest from before key ids
    assert verifier.check(MESSAGE, sig, alg=ALG_HMAC, key_id="other") == "unknown_key_id"
    assert verifier.check(MESSAGE, "0" * 64, alg=ALG_HMAC, key_id=hmac_signer.key_id) == "bad_signature"
    assert Verifier().check(MESSAGE, sig) == "unknown_key_id"


@pytest.mark.parametrize("planted", ["\u00e9" * 64, "0" * 63 + "\u00e9", "\udc80" * 64, "\u00e9"])
def test_a_hmac_signature_past_ascii_is_a_bad_signature_not_an_exception(planted):
    """Anyone who can write a leaf can plant any text as its signature: compare_digest
    raised TypeError on one past ASCII, out of every lookup of that kernel."""
    signer = HmacSigner(b"k" * 32)
    verifier = Verifier(hmac=[signer])
    assert signer.verify(MESSAGE, planted) is False
    assert verifier.check(MESSAGE, planted, alg=ALG_HMAC, key_id=signer.key_id) == "bad_signature"
    assert verifier.check(MESSAGE, planted) == "bad_signature"  # (no key id: every key is tried)


def test_hmac_signer_keeps_its_sign_and_verify_contract():
    signer = HmacSigner(b"k" * 32)
    assert signer.verify(MESSAGE, signer.sign(MESSAGE)) is True
    assert signer.verify(MESSAGE, "00") is False
    assert signer.alg == ALG_HMAC
    assert signer.key_id == HmacSigner(b"k" * 32).key_id != HmacSigner(b"j" * 32).key_id
    assert HmacSigner(b"k" * 32, key_id="team-key").key_id == "team-key"
    with pytest.raises(ConfigError):
        HmacSigner(b"short")


def test_both_signers_fit_the_signer_protocols():
    def use(signer: Signer, disk: DiskSigner) -> bool:
        return disk.verify(MESSAGE, signer.sign(MESSAGE)) and bool(signer.alg and signer.key_id)

    for signer in (HmacSigner(b"k" * 32), Ed25519Signer(SEED)):
        assert use(signer, signer)


def test_reprs_never_show_key_material():
    ed = Ed25519Signer(SEED, key_id="builder-1")
    hm = HmacSigner(b"secret-hmac-key-0123")
    assert repr(ed) == "Ed25519Signer(key_id='builder-1')"
    assert "secret" not in repr(hm) and repr(hm).startswith("HmacSigner(key_id='hmac-")
    assert repr(ed.verifier()) == "Verifier(key_ids=['builder-1'])"


def test_default_key_id_comes_from_the_public_key():
    signer = Ed25519Signer(SEED)
    assert signer.key_id == public_key_id(signer.public_key)
    assert signer.key_id.startswith("ed25519-") and len(signer.key_id) == len("ed25519-") + 16


def test_public_key_loads_from_every_common_form():
    signer = Ed25519Signer(SEED)
    raw = signer.public_key
    from cryptography.hazmat.primitives import serialization

    ssh = signer._public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    for form in (raw, raw.hex(), base64.b64encode(raw).decode(), signer.public_pem(), ssh.decode(), ssh):
        assert load_public_key(form) == raw


@pytest.mark.parametrize("bad", [b"short", "nothex", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----"])
def test_bad_public_key_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        load_public_key(bad)


def test_private_key_round_trips_through_pem():
    signer = Ed25519Signer.generate(key_id="k1")
    again = Ed25519Signer(signer.private_pem(), key_id="k1")
    assert again.public_key == signer.public_key
    assert signer.verifier().check(MESSAGE, again.sign(MESSAGE), alg=ALG_ED25519, key_id="k1") == "ok"


def test_non_ed25519_private_key_is_refused():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ConfigError):
        Ed25519Signer(pem)
    with pytest.raises(ConfigError):
        Ed25519Signer(b"garbage")


@pytest.mark.parametrize("key_id", ["", "has space", "x" * 200, "a/b"])
def test_bad_key_id_is_a_config_error(key_id):
    with pytest.raises(ConfigError):
        Ed25519Signer(SEED, key_id=key_id)
    with pytest.raises(ConfigError):
        Verifier({key_id: Ed25519Signer(SEED).public_key})
