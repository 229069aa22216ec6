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

from app.domain.chains import ChainLink
from app.domain.completion import SYNC, CompletionSettings
from app.domain.health import Expect
from app.domain.lifecycle import AttemptContext, NextStep
from app.domain.occurrences import Recurrence
from app.domain.retry import RetryPolicy
from app.domain.schedule import Schedule, jittered


class RunOutcome(enum.StrEnum):
    """What one run row records: attempts, and (missed, skipped_overlap) fire times that were
    never delivered (attempt 0). An open asynchronous attempt is shown as a run with the
    outcome `awaiting_completion` (AWAITING_COMPLETION) but has no row until it ends."""

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
    # Asynchronous completion (app/domain/completion.py): the receiver reported failure (or
    # asked for a retry), or its attempt ran out of time, or was cancelled while open.
    FAILED = "failed"
    ASYNC_TIMEOUT = "async_timeout"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    CANCELLED = "cancelled"


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
    # The job's own completion settings (None each: its target's apply).
    completion: JobCompletion | None = None
    # Its id when planning needed it (hashed cron values are resolved from it); else None,
    # and one is minted as it is prepared for insertion.
    id: uuid.UUID | None = None
    # A chained job: runs after its parent's occurrences settle, with no fire time of its own.
    after: ChainLink | None = None
    # Key/value pairs to find the job by.
    labels: dict[str, str] | None = None
    # A recurring job's own health thresholds (app/domain/health.py); None: its tenant's.
    expect: Expect | None = None
    # Targets told of each occurrence that succeeded / failed (events, app/domain/events.py).
    on_success_target_id: uuid.UUID | None = None
    on_failure_target_id: uuid.UUID | None = None


@dataclass(frozen=True)
class JobCompletion:
    """A job's override of its target's completion settings; None fields inherit."""

    mode: str | None = None
    async_timeout_s: int | None = None
    heartbeat_timeout_s: int | None = None


@dataclass(frozen=True)
class ClaimedJob:
    """A job leased to one scheduler, with what it needs to deliver it."""

    id: uuid.UUID
    partition: int
    tenant_id: uuid.UUID
    target_id: uuid.UUID
    # The payload as the database stores it (JSON text): POSTed as is, never decoded.
    payload_json: str
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
    # The target's own max_in_flight (None: the scheduler's default cap applies).
    target_max_in_flight: int | None = None
    # Sync, or async with its timeouts (the job's, else its target's).
    completion: CompletionSettings = SYNC
    # An occurrence of a chained job: the parent occurrence that caused it.
    cause_id: uuid.UUID | None = None
    # When it was due to run: its run_at as claimed (None where not read, as by the reaper).
    # Later than its fire time and jitter only when a resume released it from a hold
    # (app/domain/occurrences.py: due_delay).
    due_at: dt.datetime | None = None
    # The database's clock as the claim sent this row (its clock_timestamp(), where claimed_at
    # is the statement's start): None where not read, as by the reaper.
    sent_at: dt.datetime | None = None

    @property
    def clock_at(self) -> dt.datetime:
        """The latest reading of the database's clock this row carries: none later than the
        moment it reached the scheduler, so a wait measured from it errs late, never early."""
        return self.claimed_at if self.sent_at is None else self.sent_at

    @property
    def fire_at(self) -> dt.datetime | None:
        """A jittered occurrence's fire time (its jitter after scheduled_for); None when the
        occurrence fires at scheduled_for."""
        if self.recurrence is None or not self.recurrence.jitter_s:
            return None
        return jittered(self.id, self.scheduled_for, self.recurrence.jitter_s)

    def attempt_context(self) -> AttemptContext:
        return AttemptContext(
            self.scheduled_for,
            self.attempt,
            self.policy,
            recurrence=self.recurrence,
            runs_done=self.occurrences_run,
            first_claimed_at=self.occurrence_claimed_at,
        )


# Shown for an open asynchronous attempt (no run row yet).
AWAITING_COMPLETION = "awaiting_completion"


@dataclass(frozen=True)
class OpenedAttempt:
    """An asynchronous delivery the receiver accepted (202): recorded under the job's lease,
    which then passes to no one (ASYNC_OWNER) until the receiver reports or time runs out."""

    job: ClaimedJob
    result: AttemptOutcome
    token_digest: str

    @property
    def lease(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.job.id, self.job.lease_token)


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
