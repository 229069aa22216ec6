"""Standard Webhooks signing (https://www.standardwebhooks.com/): secrets and signatures."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_signing_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` keyed by the decoded secret."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, to_sign, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
