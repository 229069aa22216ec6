"""Per-tenant quotas: the limits that apply to a tenant (settings' defaults, overridden per
tenant) and the pure checks of a planned job against them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, IntervalSchedule, Schedule, next_cron_fire

# The quota fields, as settings (`tenant_<name>`) and per-tenant overrides name them.
LIMIT_FIELDS = (
    "requests_per_s",
    "max_active_jobs",
    "max_targets",
    "min_interval_s",
    "min_backoff_base_s",
    "max_attempts",
)
FLOAT_LIMITS = frozenset({"requests_per_s", "min_backoff_base_s"})
# Consecutive cron fire times examined for the shortest interval.
CRON_GAPS_CHECKED = 32


@dataclass(frozen=True)
class TenantLimits:
    requests_per_s: float  # 0 = unlimited
    max_active_jobs: int
    max_targets: int
    min_interval_s: int
    min_backoff_base_s: float
    max_attempts: int

    def overridden(self, overrides: dict[str, Any]) -> TenantLimits:
        """These limits with every non-null override applied."""
        given = {name: value for name, value in overrides.items() if name in LIMIT_FIELDS and value is not None}
        return dataclasses.replace(self, **given)


@dataclass(frozen=True)
class QuotaViolation:
    field: str
    message: str


def shortest_interval_s(schedule: Schedule, now: dt.datetime) -> float | None:
    """The shortest gap between the schedule's fire times (None for a one-off).

    A cron expression is measured over its next CRON_GAPS_CHECKED fire times: enough to see
    every field's step (a sub-minute or sub-hour cron shows within a few fires).
    """
    if isinstance(schedule, IntervalSchedule):
        return float(schedule.every_s)
    if not isinstance(schedule, CronSchedule):
        return None
    shortest: float | None = None
    previous = next_cron_fire(schedule, now)
    for _ in range(CRON_GAPS_CHECKED):
        following = next_cron_fire(schedule, previous)
        gap = (following - previous).total_seconds()
        shortest = gap if shortest is None else min(shortest, gap)
        previous = following
    return shortest


def job_violations(
    limits: TenantLimits, schedule: Schedule, policy: RetryPolicy, now: dt.datetime
) -> list[QuotaViolation]:
    """What in a planned job the tenant's limits refuse (empty: it may be created)."""
    found: list[QuotaViolation] = []
    interval = shortest_interval_s(schedule, now)
    if interval is not None and interval < limits.min_interval_s:
        field = "every_s" if isinstance(schedule, IntervalSchedule) else "cron"
        found.append(
            QuotaViolation(
                field, f"fires every {interval:g} s; this tenant's shortest interval is {limits.min_interval_s} s"
            )
        )
    if policy.backoff_base_s < limits.min_backoff_base_s:
        found.append(
            QuotaViolation("backoff_base_s", f"must be at least {limits.min_backoff_base_s:g} for this tenant")
        )
    if policy.max_attempts > limits.max_attempts:
        found.append(QuotaViolation("max_attempts", f"must be at most {limits.max_attempts} for this tenant"))
    return found
