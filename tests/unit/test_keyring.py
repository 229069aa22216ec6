"""The sealing format at rest: what earlier releases sealed still opens, and a sealed value that
was altered, truncated or sealed under another key is refused with KeyRingError, never opened
wrongly."""

from __future__ import annotations

import base64

import pytest

from app.keyring import HEADER_VALUE, SIGNING_SECRET, KeyRingError, parse_key_ring

# Key id `k1`, key bytes 0..31.
RING = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
# Sealed by cronhook 0.8 (cryptography's AESGCM, nonce bytes 100..111): the databases of
# earlier releases hold values like these, and a release that cannot open them loses every
# target's signing secret.
SEALED_BY_0_8 = (
    (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        SIGNING_SECRET,
        "enc1:k1:ZGVmZ2hpamtsbW5vP3OtAxq2G_h1M2aa4iIhpDOwUn3hOaM2n5jgGKHqynrYiAyhH2UPMxyakxGDZEzWyN99jlI6",
    ),
    ("Bearer t0ken", HEADER_VALUE, "enc1:k1:ZGVmZ2hpamtsbW5vCn6_FBybduoOCTqG7Su8NGWDGuA7a4RSUuxgsA=="),
)


@pytest.mark.parametrize(("plaintext", "purpose", "sealed"), SEALED_BY_0_8)
def test_values_sealed_by_earlier_releases_still_open(plaintext: str, purpose: str, sealed: str) -> None:
    assert parse_key_ring(RING).open(sealed, purpose) == plaintext


def test_a_sealed_value_opens_only_with_its_key_and_purpose() -> None:
    ring = parse_key_ring(RING)
    sealed = ring.seal("s3cret", SIGNING_SECRET)
    assert sealed.startswith("enc1:k1:")
    assert ring.open(sealed, SIGNING_SECRET) == "s3cret"
    # A fresh nonce per sealing: the same secret never seals to the same text.
    assert ring.seal("s3cret", SIGNING_SECRET) != sealed
    with pytest.raises(KeyRingError, match="does not open"):
        ring.open(sealed, HEADER_VALUE)
    other = parse_key_ring("k1:" + base64.b64encode(bytes(range(1, 33))).decode())
    with pytest.raises(KeyRingError, match="does not open"):
        other.open(sealed, SIGNING_SECRET)


def test_an_altered_or_truncated_sealed_value_is_refused() -> None:
    ring = parse_key_ring(RING)
    sealed = SEALED_BY_0_8[0][2]
    raw = bytearray(base64.urlsafe_b64decode(sealed.removeprefix("enc1:k1:")))
    for index in (0, 12, len(raw) - 1):  # nonce, ciphertext, tag
        altered = bytearray(raw)
        altered[index] ^= 1
        with pytest.raises(KeyRingError, match="does not open"):
            ring.open("enc1:k1:" + base64.urlsafe_b64encode(bytes(altered)).decode(), SIGNING_SECRET)
    for cut in (0, 11, 27):  # shorter than a nonce and a tag
        with pytest.raises(KeyRingError, match="malformed"):
            ring.open("enc1:k1:" + base64.urlsafe_b64encode(bytes(raw[:cut])).decode(), SIGNING_SECRET)
    with pytest.raises(KeyRingError, match="malformed"):
        ring.open("enc1:k1:not*base64", SIGNING_SECRET)
    with pytest.raises(KeyRingError, match="no key 'k9'"):
        ring.open("enc1:k9:" + base64.urlsafe_b64encode(bytes(raw)).decode(), SIGNING_SECRET)
