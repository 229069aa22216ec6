"""What a job is to the code that moves it: a job to create, a job leased for delivery, an
attempt's outcome, and the outcome words a run row may carry (mirrored by the runs CHECK in
app/store/tables.py).

Plain values, no I/O; the store turns rows into these (app/store/job_rows.py) and back.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass
from typing import Any

from app.domain.lifecycle import AttemptContext, NextStep
from app.domain.occurrences import Recurrence
from app.domain.retry import RetryPolicy
from app.domain.schedule import Schedule


class RunOutcome(enum.StrEnum):
    """What one run row records. The first five are attempts; the last two are fire times
    that were never delivered (attempt 0)."""

    SUCCESS = "success"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    # The scheduler holding the lease did not record an outcome in time; the reaper did.
    LEASE_EXPIRED = "lease_expired"
    # Given up by the misfire policy (more than misfire_grace_s late).
    MISSED = "missed"
    # Came due while the previous occurrence was still in flight (overlap_policy forbid).
    SKIPPED_OVERLAP = "skipped_overlap"


@dataclass(frozen=True)
class NewJob:
    tenant_id: uuid.UUID
    target_id: uuid.UUID
    name: str | None
    payload: Any
    priority: int
    schedule: Schedule
    first_fire_at: dt.datetime
    policy: RetryPolicy
    dedup_key: str | None = None
    # Recurring jobs: policies and bounds (its anchor is `anchor_at` below).
    recurrence: Recurrence | None = None
    anchor_at: dt.datetime | None = None  # default: first_fire_at
    parent_job_id: uuid.UUID | None = None  # a one-off carrying an occurrence of this job


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to one scheduler, with what it needs to deliver it."""

    id: uuid.UUID
    partition: int
    tenant_id: uuid.UUID
    target_id: uuid.UUID
    payload: Any
    schedule: Schedule
    schedule_anchor_at: dt.datetime
    scheduled_for: dt.datetime
    occurrence_id: uuid.UUID
    attempt: int
    policy: RetryPolicy
    lease_token: uuid.UUID
    lease_owner: str
    claimed_at: dt.datetime  # the database's now() at claim time
    # The database's now() when this occurrence's first attempt was claimed (None on rows
    # claimed before migration 0005).
    occurrence_claimed_at: dt.datetime | None
    url: str
    headers: dict[str, str]
    timeout_s: float
    signing_secret: str
    # The target's statuses to retry, replacing the default set; None = default.
    retry_on_status: frozenset[int] | None = None
    # Recurring jobs: bounds and policies (None for one-offs), and occurrences delivered so far.
    recurrence: Recurrence | None = None
    occurrences_run: int = 0
    # The secret a rotation replaced, still signing during its grace period.
    previous_signing_secret: str | None = None

    def attempt_context(self) -> AttemptContext:
        return AttemptContext(
            self.scheduled_for,
            self.attempt,
            self.policy,
            recurrence=self.recurrence,
            runs_done=self.occurrences_run,
            first_claimed_at=self.occurrence_claimed_at,
        )


@dataclass(frozen=True)
class AttemptOutcome:
    outcome: RunOutcome
    status_code: int | None = None
    error: str | None = None
    duration_ms: int | None = None
    started_at: dt.datetime | None = None
    # Not stored: they steer what happens next (app/domain/lifecycle.py).
    retryable: bool = True
    retry_after_s: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome == RunOutcome.SUCCESS


@dataclass(frozen=True)
class FinishedAttempt:
    """An attempt's outcome and the step it leads to, to be recorded under the job's lease."""

    job: ClaimedJob
    result: AttemptOutcome
    step: NextStep

    @property
    def lease(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.job.id, self.job.lease_token)
