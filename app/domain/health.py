"""Schedule health: whether a job's schedule is working. Pure rules (STUB: being written)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthDefaults:
    """The settings' thresholds, for jobs (and tenants) that set none."""

    max_consecutive_failures: int = 1
    success_within_s: int | None = None
