"""Asynchronous completion: work longer than a request.

A target (or a job, overriding it) in `async` completion mode receives each delivery with a
completion URL. A `202 Accepted` answer leaves the attempt open: the job stays `running`,
held by no scheduler (its lease owner is ASYNC_OWNER, never a replica's id) until the
receiver reports the outcome, or its deadline or heartbeat deadline passes and the reaper
fails it. Any other answer finishes the attempt as a synchronous delivery would.

The completion token names the attempt: the job's id and the lease token the delivery was
sent under (a fresh random UUID per claim), 128 random bits, and an HMAC of the three under
the process's key ring (app/keyring.py), so any API replica can tell a token cronhook minted
from a guess without a lookup, even before the 202 is recorded. A token of an attempt that
has ended (rescued, retried, cancelled, timed out) no longer matches the job's lease: it is
fenced. Pure: no I/O; the MAC keys are passed in.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

# The lease owner of an open asynchronous attempt: no replica holds it (a replica id starting
# with `~` is refused by the settings), so a replica's death or hand-over never touches it.
# (No colon: SQLAlchemy reads `:name` in DDL text as a bind parameter.)
ASYNC_OWNER = "~async"

DEFAULT_ASYNC_TIMEOUT_S = 3_600
MAX_ASYNC_TIMEOUT_S = 7 * 86_400
MIN_TIMEOUT_S = 1
MAX_PROGRESS_MESSAGE_CHARS = 200
MAX_REPORT_ERROR_CHARS = 1_000
MAX_RESULT_BYTES = 64 * 1024
MAX_REPORT_RETRY_AFTER_S = 7 * 86_400

TOKEN_PREFIX = "ct1_"
_NONCE_BYTES = 16
_TAG_BYTES = 16
_TOKEN_BYTES = 16 + 16 + _NONCE_BYTES + _TAG_BYTES
_MAC_CONTEXT = b"cronhook completion token v1\x00"


class CompletionMode(enum.StrEnum):
    # The attempt ends with the receiver's answer (today's behaviour).
    SYNC = "sync"
    # A 202 leaves the attempt open until the receiver reports on the completion URL.
    ASYNC = "async"


class ReportOutcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    # The work failed for good: no retry (a one-off is dead-lettered at once).
    FAILED = "failed"
    # The work failed and should be tried again under the job's retry policy.
    RETRY = "retry"


@dataclass(frozen=True)
class CompletionSettings:
    """A job's completion mode with its timeouts, as the claim resolves them (the job's own
    values, else its target's)."""

    mode: CompletionMode = CompletionMode.SYNC
    async_timeout_s: int = DEFAULT_ASYNC_TIMEOUT_S
    heartbeat_timeout_s: int | None = None

    @property
    def is_async(self) -> bool:
        return self.mode == CompletionMode.ASYNC


SYNC = CompletionSettings()


def heartbeat_fits(async_timeout_s: int | None, heartbeat_timeout_s: int | None) -> bool:
    """A heartbeat timeout longer than the attempt's own could never fire: refused. (Either
    unset: nothing to compare.)"""
    return async_timeout_s is None or heartbeat_timeout_s is None or heartbeat_timeout_s <= async_timeout_s


def resolve_settings(
    job_mode: str | None,
    job_async_timeout_s: int | None,
    job_heartbeat_timeout_s: int | None,
    target_mode: str | None,
    target_async_timeout_s: int | None,
    target_heartbeat_timeout_s: int | None,
) -> CompletionSettings:
    """The job's values where it sets them, else the target's, else the defaults."""
    mode = job_mode or target_mode
    if mode is None or mode == CompletionMode.SYNC:
        return SYNC
    timeout = job_async_timeout_s or target_async_timeout_s or DEFAULT_ASYNC_TIMEOUT_S
    heartbeat = job_heartbeat_timeout_s if job_heartbeat_timeout_s is not None else target_heartbeat_timeout_s
    return CompletionSettings(CompletionMode.ASYNC, timeout, heartbeat)


@dataclass(frozen=True)
class CompletionToken:
    job_id: uuid.UUID
    lease_token: uuid.UUID
    text: str

    @property
    def digest(self) -> str:
        """What is stored of the token: its SHA-256, hex."""
        return token_digest(self.text)


def token_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, _MAC_CONTEXT + body, hashlib.sha256).digest()[:_TAG_BYTES]


def mint_token(mac_key: bytes, job_id: uuid.UUID, lease_token: uuid.UUID) -> CompletionToken:
    body = job_id.bytes + lease_token.bytes + secrets.token_bytes(_NONCE_BYTES)
    raw = body + _tag(mac_key, body)
    text = TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return CompletionToken(job_id, lease_token, text)


def read_token(mac_keys: list[bytes], text: str) -> CompletionToken | None:
    """The attempt a token names, or None when cronhook did not mint it (under any key of
    the ring: tokens outlive a key rotation while the old key stays in the ring)."""
    if not text.startswith(TOKEN_PREFIX) or len(text) > 200:
        return None
    encoded = text[len(TOKEN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != _TOKEN_BYTES:
        return None
    body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
    if not any(hmac.compare_digest(_tag(key, body), tag) for key in mac_keys):
        return None
    return CompletionToken(uuid.UUID(bytes=body[:16]), uuid.UUID(bytes=body[16:32]), text)


def completion_url(public_url: str, token: CompletionToken) -> str:
    return f"{public_url.rstrip('/')}/v1/completions/{token.text}"
