"""Secrets at rest: the key ring (`CRONHOOK_SECRET_KEYS` or a generated key file) and the
sealing of signing secrets and target header values with AES-256-GCM.

A sealed value is `enc1:<key id>:<base64url(nonce | ciphertext | tag)>`; the first key of
the ring seals, every key opens, so keys rotate by putting a new one first and re-sealing
(`cronhook secrets rotate`). A process loads its ring once (Runtime, or create_app given an
engine) and hands it to what seals or opens: the scheduler and reaper (for the claim's row
mapper, app/store/job_rows.py), the API's state (for the target routes). Opening is cached
by sealed text (every sealing draws a fresh nonce, so a sealed text names exactly one
plaintext), so the claim's hot path pays the AES work once per value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

# pycryptodomex rather than cryptography: the same AES-GCM (a value sealed by either opens
# with the other), at a third of the memory: cryptography's Rust extension, OpenSSL linked
# in, kept ~8 MB resident in every process (bench/log/2026-11-29-key-ring-library.md).
from Cryptodome.Cipher import AES

if TYPE_CHECKING:
    from Cryptodome.Cipher._mode_gcm import GcmMode

SEALED_PREFIX = "enc1:"
KEY_FILE_NAME = "secret-keys"
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_NONCE_BYTES = 12
_TAG_BYTES = 16
# Distinct values are few (targets x headers); the cache only saves the AES work per delivery.
_OPEN_CACHE_SIZE = 65_536
# What a sealed value is for, bound into it (a value sealed for one does not open as another).
SIGNING_SECRET = "signing_secret"
HEADER_VALUE = "header_value"


class KeyRingError(ValueError):
    """A key ring that cannot be used, or a sealed value no key of the ring opens."""


def is_sealed(value: str) -> bool:
    return value.startswith(SEALED_PREFIX)


def sealed_key_id(value: str) -> str | None:
    if not is_sealed(value):
        return None
    return value[len(SEALED_PREFIX) :].split(":", 1)[0]


class KeyRing:
    """Named 256-bit AES-GCM keys; the first seals, all open."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyRingError("the key ring is empty")
        seen: set[str] = set()
        for key_id, key in keys:
            if not _KEY_ID.match(key_id):
                raise KeyRingError(f"key id {key_id!r} must be 1-32 characters of A-Z a-z 0-9 _ -")
            if len(key) != 32:
                raise KeyRingError(f"key {key_id!r} must be 32 bytes (base64 of 32 random bytes)")
            if key_id in seen:
                raise KeyRingError(f"key id {key_id!r} appears twice")
            seen.add(key_id)
        self.primary_id = keys[0][0]
        self.key_ids = [key_id for key_id, _ in keys]
        self._keys = dict(keys)
        # Keys for MACs (completion tokens, app/domain/completion.py), derived apart from the
        # sealing keys; the first mints, all verify.
        self.mac_keys = [hmac.new(key, b"cronhook mac key", hashlib.sha256).digest() for _, key in keys]
        self._open_sealed = lru_cache(maxsize=_OPEN_CACHE_SIZE)(self._open)

    def seal(self, plaintext: str, purpose: str) -> str:
        """`purpose` (e.g. `signing_secret`) is bound as associated data: a sealed header value
        copied into the secret column does not open."""
        nonce = os.urandom(_NONCE_BYTES)
        ciphertext, tag = _gcm(self._keys[self.primary_id], nonce, purpose).encrypt_and_digest(plaintext.encode())
        return f"{SEALED_PREFIX}{self.primary_id}:{base64.urlsafe_b64encode(nonce + ciphertext + tag).decode()}"

    def open(self, value: str, purpose: str) -> str:
        if not is_sealed(value):
            # Rows written before encryption at rest, until start-up seals them.
            return value
        return self._open_sealed(value, purpose)

    def seal_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return {name: self.seal(value, HEADER_VALUE) for name, value in headers.items()}

    def open_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return {name: self.open(value, HEADER_VALUE) for name, value in headers.items()}

    def _open(self, value: str, purpose: str) -> str:
        try:
            key_id, encoded = value[len(SEALED_PREFIX) :].split(":", 1)
            raw = base64.urlsafe_b64decode(encoded)
        except (ValueError, binascii.Error) as exc:
            raise KeyRingError("a sealed value is malformed") from exc
        key = self._keys.get(key_id)
        if key is None:
            raise KeyRingError(f"no key {key_id!r} in CRONHOOK_SECRET_KEYS to open a stored secret")
        if len(raw) < _NONCE_BYTES + _TAG_BYTES:
            raise KeyRingError("a sealed value is malformed")
        cipher = _gcm(key, raw[:_NONCE_BYTES], purpose)
        try:
            # ValueError: the tag does not match (another key, or altered text); a value that
            # is not UTF-8 (UnicodeDecodeError, a ValueError too) was never sealed by cronhook.
            return cipher.decrypt_and_verify(raw[_NONCE_BYTES:-_TAG_BYTES], raw[-_TAG_BYTES:]).decode()
        except ValueError as exc:
            raise KeyRingError(f"key {key_id!r} does not open a stored secret (wrong key?)") from exc

    def needs_resealing(self, value: str) -> bool:
        return sealed_key_id(value) != self.primary_id


def _gcm(key: bytes, nonce: bytes, purpose: str) -> GcmMode:
    """A one-use AES-GCM cipher with `purpose` bound as associated data."""
    cipher = AES.new(key, AES.MODE_GCM, nonce=nonce, mac_len=_TAG_BYTES)
    cipher.update(purpose.encode())
    return cipher


def new_key_entry(key_id: str | None = None) -> str:
    """A fresh `id:base64key` entry for CRONHOOK_SECRET_KEYS."""
    return f"{key_id or 'k' + secrets.token_hex(4)}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


def parse_key_ring(spec: str) -> KeyRing:
    """`id:base64key[,id:base64key...]`, the sealing key first."""
    keys: list[tuple[str, bytes]] = []
    for entry in (part.strip() for part in spec.replace("\n", ",").split(",")):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep:
            raise KeyRingError("each key must be written `id:base64key`")
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error as exc:
            raise KeyRingError(f"key {key_id!r} is not valid base64") from exc
        keys.append((key_id.strip(), key))
    return KeyRing(keys)


def load_key_file(data_dir: Path) -> KeyRing:
    """The key ring in `data_dir`/secret-keys, generated (mode 0600) on first use."""
    path = data_dir / KEY_FILE_NAME
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process of this data dir won the race; read its key
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(new_key_entry() + "\n")
    if path.stat().st_mode & 0o077:
        raise KeyRingError(f"{path} must not be readable by group or others (chmod 600)")
    return parse_key_ring(path.read_text())
