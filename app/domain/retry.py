"""Retry backoff math: exponential with full jitter, capped. Pure; randomness is passed in."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float


def backoff_ceiling(policy: RetryPolicy, attempt: int) -> float:
    """Upper bound of the delay after failed attempt number `attempt` (1-based)."""
    exponent = max(attempt - 1, 0)
    # Cap the exponent before computing so a large attempt number cannot overflow.
    if exponent > 62:
        return policy.backoff_max_s
    return float(min(policy.backoff_max_s, policy.backoff_base_s * (2**exponent)))


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): uniform in [0, ceiling]. Spreads retry storms."""
    return rng.uniform(0.0, backoff_ceiling(policy, attempt))


def attempts_exhausted(policy: RetryPolicy, attempt: int) -> bool:
    return attempt >= policy.max_attempts
