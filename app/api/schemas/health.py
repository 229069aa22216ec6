"""Schedule health in the API: a job's `expect` (its own thresholds) in and out, and the
health a job row shows when the statement that read it did not say (app/domain/health.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from app.api.schemas.inputs import RequestModel
from app.domain.health import ALERT_FAILING, Health, HealthFacts, shown_health
from app.domain.schedule import MAX_SCHEDULE_AHEAD

# A deadline reaches as far as a schedule may (ten years).
MAX_SUCCESS_WITHIN_S = int(MAX_SCHEDULE_AHEAD.total_seconds())
MAX_CONSECUTIVE_FAILURES = 10_000


class Expect(RequestModel):
    """A recurring job's health thresholds (README: Schedule health); either may be left out
    for its tenant's default."""

    success_within_s: Annotated[int | None, Field(strict=True, ge=1, le=MAX_SUCCESS_WITHIN_S)] = Field(
        default=None, description="Failing when no occurrence succeeded within this many seconds"
    )
    max_consecutive_failures: Annotated[int | None, Field(strict=True, ge=1, le=MAX_CONSECUTIVE_FAILURES)] = Field(
        default=None,
        description="Failing after this many failed occurrences in a row (dead-lettered, or fire times missed)",
    )


class ExpectPublic(BaseModel):
    success_within_s: int | None = Field(description="null: the tenant's default")
    max_consecutive_failures: int | None = Field(description="null: the tenant's default")


def expect_public(row: Any) -> ExpectPublic | None:
    within, most = row["expect_success_within_s"], row["expect_max_consecutive_failures"]
    if within is None and most is None:
        return None
    return ExpectPublic(success_within_s=within, max_consecutive_failures=most)


def health_facts_of_row(row: Any, target_paused: bool) -> HealthFacts:
    """What a job row's health is judged from (app/domain/health.py), given whether its
    target or tenant is paused."""
    return HealthFacts(
        state=row["state"],
        created_at=row["created_at"],
        consecutive_failures=row["consecutive_failures"],
        last_success_at=row["last_success_at"],
        last_failure_at=row["last_failure_at"],
        run_at=row["run_at"],
        misfire_grace_s=row["misfire_grace_s"],
        held=row["held_run_at"] is not None,
        target_paused=target_paused,
        alerted=row["health_alert"] == ALERT_FAILING,
        resumed_at=row.get("resumed_at"),
    )


def health_of_row(row: Any) -> Health:
    """The health a row read without it shows (app/domain/health.py), from its own columns:
    written by a statement, it was read at its `updated_at` (that statement's now()). Its
    target's pause shows only through a held occurrence."""
    facts = health_facts_of_row(row, target_paused=bool(row.get("target_paused")))
    return shown_health(facts, row.get("db_now") or row["updated_at"])
