"""Retry math: exponential backoff with full jitter, which statuses are worth retrying, and
Retry-After. Pure; randomness and `now` are passed in."""

from __future__ import annotations

import datetime as dt
import email.utils
import random
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    # Each retry waits up to `factor` times longer than the previous one could.
    backoff_factor: float = 2.0


def backoff_ceiling(policy: RetryPolicy, attempt: int) -> float:
    """Upper bound of the delay after failed attempt number `attempt` (1-based):
    min(max, base * factor^(attempt-1))."""
    exponent = max(attempt - 1, 0)
    try:
        ceiling = policy.backoff_base_s * policy.backoff_factor**exponent
    except OverflowError:  # a large attempt number with a large factor
        return policy.backoff_max_s
    return float(min(policy.backoff_max_s, ceiling))


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): uniform in [0, ceiling]. Spreads retry storms."""
    return rng.uniform(0.0, backoff_ceiling(policy, attempt))


def attempts_exhausted(policy: RetryPolicy, attempt: int) -> bool:
    return attempt >= policy.max_attempts


# Statuses worth retrying: the receiver may answer differently later. Any other 4xx says
# the request itself is wrong (404, 401, 422...), so retrying only repeats the failure.
RETRYABLE_4XX = frozenset({408, 425, 429})
# Redirects are never followed, but one may be temporary (maintenance): retried.
# A Retry-After beyond this is not honoured in full (documented in README).
MAX_RETRY_AFTER_S = 3600.0


def is_retryable_status(status: int, override: Collection[int] | None = None) -> bool:
    """`override` is a target's own list of statuses to retry; it replaces the default set."""
    if override is not None:
        return status in override
    return status >= 500 or status in RETRYABLE_4XX or 300 <= status < 400


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Seconds to wait per a Retry-After header (delta-seconds or HTTP-date), capped at
    MAX_RETRY_AFTER_S; None when absent or unparseable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)  # HTTP-dates are GMT
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER_S)
