"""Standard Webhooks signing (https://www.standardwebhooks.com/): secrets and signatures."""

from __future__ import annotations

import base64
import functools
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_signing_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` keyed by the decoded secret."""
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    # hmac.digest: OpenSSL's one-shot HMAC, without building an HMAC object per signature.
    digest = hmac.digest(_secret_key(secret), to_sign, "sha256")
    return "v1," + base64.b64encode(digest).decode()


@functools.lru_cache(maxsize=4096)
def _secret_key(secret: str) -> bytes:
    """A secret's key bytes: decoded once per secret, not once per delivery."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))
