"""Jobs and their runs: create, update (PATCH) and public models."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, JsonValue, WithJsonSchema

from app.api.schemas.health import Expect, ExpectPublic, expect_public, health_of_row
from app.api.schemas.inputs import Labels, PlainText, RequestModel, Timestamp, check_json_payload
from app.api.schemas.targets import AsyncTimeout, Completion, HeartbeatTimeout
from app.domain.chains import ChainOn
from app.domain.completion import ASYNC_OWNER, CompletionMode
from app.domain.health import Health
from app.domain.job import AWAITING_COMPLETION, RunOutcome
from app.domain.occurrences import (
    DEFAULT_CATCH_UP_LIMIT,
    DEFAULT_MISFIRE_GRACE_S,
    MAX_CATCH_UP_LIMIT,
    IntervalMode,
    MisfirePolicy,
    OverlapPolicy,
)
from app.domain.priority import MAX_PRIORITY, MIN_PRIORITY
from app.domain.schedule import MAX_JITTER_S, MAX_SCHEDULE_AHEAD, ScheduleKind
from app.domain.states import JobState
from app.store.job_rows import next_run_at

# Every outcome a run may show: its row's, and an open async attempt's.
RUN_OUTCOMES = [o.value for o in RunOutcome] + [AWAITING_COMPLETION]

# A delay reaches as far as a run_at may (ten years).
MAX_DELAY_S = int(MAX_SCHEDULE_AHEAD.total_seconds())


class ChainAfter(RequestModel):
    """The job a chained job runs after, and which of its settled occurrences fire it."""

    job_id: uuid.UUID = Field(description="The parent: a job of this tenant, not finished")
    on: ChainOn | None = Field(
        default=None,
        description="success (default: an attempt succeeded), failure (the occurrence was dead-lettered) or any",
    )


class JobCreate(RequestModel):
    target_id: uuid.UUID
    payload: Annotated[dict[str, Any] | None, AfterValidator(check_json_payload)] = Field(
        default=None, description="A JSON object, sent as the webhook body"
    )
    name: Annotated[PlainText | None, Field(max_length=200)] = None
    priority: Annotated[int, Field(strict=True, ge=MIN_PRIORITY, le=MAX_PRIORITY)] = MIN_PRIORITY
    max_attempts: Annotated[int | None, Field(strict=True, ge=1, le=100)] = None
    backoff_base_s: Annotated[float | None, Field(strict=True, gt=0, le=86400)] = None
    backoff_max_s: Annotated[float | None, Field(strict=True, gt=0, le=7 * 86400)] = None
    backoff_factor: Annotated[float | None, Field(strict=True, ge=1, le=10)] = None
    run_at: Timestamp | None = Field(default=None, description="RFC 3339 timestamp with offset")
    delay_s: Annotated[float | None, Field(strict=True, gt=0, le=MAX_DELAY_S)] = None
    cron: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = Field(
        default=None,
        description="Cron expression (5 fields, or 6 with leading seconds). `H`, `H/n`, `H(a-b)` and `H(a-b)/n` "
        "in any field stand for a value hashed from the job (stable for its life): see resolved_cron",
    )
    timezone: Annotated[PlainText | None, Field(min_length=1, max_length=64)] = Field(
        default=None, description="IANA time zone for `cron` (default UTC)"
    )
    every_s: Annotated[int | None, Field(strict=True, ge=1, le=366 * 86400)] = None
    dedup_key: Annotated[PlainText | None, Field(min_length=1, max_length=200)] = Field(
        default=None,
        description="Unique among this tenant's unfinished jobs: a second create with it is a 409 naming the job",
    )
    # Recurring jobs only (cron or every_s); defaults in README.
    interval_mode: IntervalMode | None = Field(
        default=None, description="every_s only: fixed_rate (default, anchored) or fixed_delay (after each run)"
    )
    misfire_policy: MisfirePolicy | None = Field(
        default=None, description="Late by more than misfire_grace_s: skip, fire_once (default) or catch_up"
    )
    misfire_grace_s: Annotated[float | None, Field(strict=True, ge=0, le=86_400)] = Field(
        default=None,
        description=f"A fire time at most this late still counts as on time (default {DEFAULT_MISFIRE_GRACE_S:g})",
    )
    catch_up_limit: Annotated[int | None, Field(strict=True, ge=1, le=MAX_CATCH_UP_LIMIT)] = Field(
        default=None,
        description="catch_up delivers at most this many missed occurrences of a backlog "
        f"(default {DEFAULT_CATCH_UP_LIMIT})",
    )
    overlap_policy: OverlapPolicy | None = Field(
        default=None,
        description="Fire times that come due while an occurrence is in flight: forbid (default: skipped) or allow "
        "(each fires on time; its delivery is carried by a one-off child job, see parent_job_id)",
    )
    jitter_s: Annotated[int | None, Field(strict=True, ge=0, le=MAX_JITTER_S)] = Field(
        default=None,
        description="Each occurrence fires up to this many seconds after its nominal time (default 0; at most "
        "half the schedule's period and an hour). cronhook-scheduled-for stays the nominal time; "
        "cronhook-fire-at is the delayed one",
    )
    start_at: Timestamp | None = Field(default=None, description="No fire time before this")
    end_at: Timestamp | None = Field(default=None, description="No fire time after this; then the job ends")
    completion: Completion = Field(default=None, description="Overrides the target's completion mode (sync/async)")
    async_timeout_s: AsyncTimeout = Field(default=None, description="Overrides the target's async_timeout_s")
    heartbeat_timeout_s: HeartbeatTimeout = Field(
        default=None, description="Overrides the target's heartbeat_timeout_s"
    )
    max_runs: Annotated[int | None, Field(strict=True, ge=1, le=10**9)] = Field(
        default=None, description="End the job after this many delivered occurrences"
    )
    after: ChainAfter | None = Field(
        default=None,
        description="Instead of a schedule: run once each time an occurrence of this job settles (exactly once "
        "per parent occurrence, which the delivery names in cronhook-cause-id)",
    )
    payload_from: Literal["parent_result"] | None = Field(
        default=None,
        description="Chained jobs: each occurrence's payload is the parent's completion result when it reported one",
    )
    labels: Labels | None = Field(
        default=None,
        description="Up to 16 key/value pairs to find the job by (`?label=team=payments`); keys 1-63 of "
        "a-z 0-9 . _ / -, values 0-63 of A-Z a-z 0-9 . _ -",
    )
    expect: Expect | None = Field(
        default=None,
        description="Recurring jobs only: when the schedule counts as failing (its health, job.health.failing "
        "events); unset thresholds are the tenant's defaults",
    )
    on_success_target_id: uuid.UUID | None = Field(
        default=None, description="A target of this tenant sent occurrence.succeeded for each occurrence that succeeds"
    )
    on_failure_target_id: uuid.UUID | None = Field(
        default=None,
        description="A target of this tenant sent occurrence.dead_lettered for each occurrence that fails",
    )


class JobUpdate(JobCreate):
    """PATCH /v1/jobs/{id}: only the fields sent change. A new schedule (one of run_at,
    delay_s, cron [+ timezone], every_s) replaces the old one and recomputes the next fire time."""

    target_id: uuid.UUID | None = None  # type: ignore[assignment]


class ChainLinkPublic(BaseModel):
    job_id: uuid.UUID
    on: ChainOn


class JobPublic(BaseModel):
    id: uuid.UUID
    key: str | None = Field(description="A named schedule's key (PUT /v1/schedules/{key}); null for other jobs")
    set: str | None = Field(description="The schedule set the named schedule belongs to (PUT /v1/schedule-sets/{set})")
    labels: dict[str, str] = Field(description="Key/value pairs to find the job by")
    name: str | None
    target_id: uuid.UUID
    state: JobState
    payload: JsonValue = Field(description="In lists, null unless `include=payload`")
    priority: int
    # ScheduleKind's values, spelled out so the contract shows them inline.
    schedule_kind: Literal["once", "cron", "interval", "after"]
    cron: str | None = Field(description="The cron expression as written")
    resolved_cron: str | None = Field(
        description="The expression the fire times follow: `cron` with each hashed value (`H`) resolved"
    )
    timezone: str | None
    every_s: int | None
    dedup_key: str | None
    interval_mode: IntervalMode | None = Field(description="every_s jobs only")
    misfire_policy: MisfirePolicy | None = Field(description="Recurring jobs only")
    misfire_grace_s: float | None
    catch_up_limit: int | None
    overlap_policy: OverlapPolicy | None
    jitter_s: int | None = Field(description="Recurring jobs: each occurrence fires up to this many seconds late")
    start_at: dt.datetime | None
    end_at: dt.datetime | None
    max_runs: int | None
    runs: int = Field(description="Occurrences delivered (succeeded or dead-lettered)")
    ended_reason: str | None = Field(description="Why a recurring job ended: max_runs, end_at or schedule")
    parent_job_id: uuid.UUID | None = Field(
        description="Set on a one-off job that carries an occurrence of a recurring job: a trigger, or an "
        "occurrence handed off under overlap_policy allow"
    )
    next_run_at: dt.datetime | None = Field(description="When the job next becomes due (fire time or retry)")
    scheduled_for: dt.datetime = Field(description="Nominal fire time of the current occurrence")
    attempt: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    backoff_factor: float
    last_status_code: int | None
    last_error: str | None
    completion: CompletionMode | None = Field(description="The job's own completion mode; null = its target's")
    async_timeout_s: int | None = Field(description="The job's own async_timeout_s; null = its target's")
    heartbeat_timeout_s: int | None = Field(description="The job's own heartbeat_timeout_s; null = its target's")
    awaiting_completion: bool = Field(
        description="An async attempt is open: its receiver answered 202 and has not reported yet"
    )
    deadline_at: dt.datetime | None = Field(
        description="Open attempt: when it fails at the latest (async_timeout_s from its delivery)"
    )
    heartbeat_deadline_at: dt.datetime | None = Field(
        description="Open attempt: when it fails unless the receiver reports (the earlier of the heartbeat "
        "timeout and deadline_at)"
    )
    last_heartbeat_at: dt.datetime | None = Field(description="Open attempt: the receiver's last heartbeat")
    progress: int | None = Field(description="Open attempt: the receiver's last reported progress, 0-100")
    progress_message: str | None = Field(description="Open attempt: the receiver's last progress message")
    pause_requested: bool = Field(
        description="Paused while an async attempt was open: the job is paused when the attempt ends"
    )
    after: ChainLinkPublic | None = Field(description="A chained job: the job it runs after, and on which outcome")
    payload_from: str | None = Field(description="A chained job: parent_result, or null (its own payload)")
    cause_id: str | None = Field(
        description="An occurrence of a chained job: the webhook-id of the parent occurrence that caused it"
    )
    health: Health = Field(
        description="healthy, late (an occurrence waits past its misfire grace), failing (job.health.failing "
        "reported, not recovered yet), paused (the job, its target or its tenant), unknown (nothing succeeded yet)"
    )
    last_success_at: dt.datetime | None = Field(description="When an occurrence last succeeded")
    last_failure_at: dt.datetime | None = Field(
        description="When an occurrence last failed (dead-lettered, or a fire time missed)"
    )
    consecutive_failures: int = Field(description="Failed occurrences since the last success")
    expect: ExpectPublic | None = Field(description="The job's own health thresholds; null: its tenant's defaults")
    on_success_target_id: uuid.UUID | None
    on_failure_target_id: uuid.UUID | None
    event_type: str | None = Field(description="Set on an event's delivery: the event's type")
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


def _webhook_id(value: uuid.UUID | str | None) -> str | None:
    """A parent occurrence's id as its deliveries named it (webhook-id)."""
    return f"msg_{value.hex}" if isinstance(value, uuid.UUID) else value


def _known_outcome(value: str) -> str:
    if value not in RUN_OUTCOMES:
        raise ValueError(f"unknown outcome {value!r}")
    return value


class RunPublic(BaseModel):
    id: int
    job_id: uuid.UUID = Field(
        description="The job that made the attempt: this job, or a child carrying one of its occurrences "
        "(a trigger, or any occurrence under overlap_policy allow)"
    )
    scheduled_for: dt.datetime = Field(description="The occurrence's nominal fire time")
    cause_id: Annotated[str | None, BeforeValidator(_webhook_id)] = Field(
        default=None, description="An attempt of a chained job: the webhook-id of the parent occurrence it ran after"
    )
    fire_at: dt.datetime | None = Field(
        default=None, description="A jittered occurrence's fire time (jitter_s); null when it was scheduled_for"
    )
    attempt: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None = Field(description="Null while the attempt is open (awaiting_completion)")
    status_code: int | None
    duration_ms: int | None
    # Inline in the OpenAPI document (no component of its own), as the values were first published.
    outcome: Annotated[
        str,
        AfterValidator(_known_outcome),
        WithJsonSchema({"type": "string", "enum": RUN_OUTCOMES, "title": "Outcome"}),
    ] = Field(
        description="An attempt's result; `missed` (given up by the misfire policy) and `skipped_overlap` (came due "
        "while the previous occurrence was in flight) are fire times never delivered (attempt 0). Async "
        "attempts: `awaiting_completion` while open (the newest entry), then `success` or `failed` as the "
        "receiver reported, or `async_timeout`, `heartbeat_timeout`, `cancelled`"
    )
    error: str | None
    result: JsonValue = Field(default=None, description="Async attempts: the result the receiver reported")
    reported_at: dt.datetime | None = Field(default=None, description="Async attempts: when the receiver reported")
    fenced_at: dt.datetime | None = Field(
        default=None,
        description="Async attempts: when a report arrived after the attempt had ended otherwise (answered 410)",
    )
    deadline_at: dt.datetime | None = Field(default=None, description="Open attempt: when it fails at the latest")
    last_heartbeat_at: dt.datetime | None = Field(default=None, description="Open attempt: the last heartbeat")
    progress: int | None = Field(default=None, description="Open attempt: the last reported progress, 0-100")
    progress_message: str | None = Field(default=None, description="Open attempt: the last progress message")


def is_awaiting(row: Any) -> bool:
    return bool(row["state"] == JobState.RUNNING and row["lease_owner"] == ASYNC_OWNER)


def open_run(row: Any) -> RunPublic:
    """A job's open async attempt, shown as a run (it has no row until it ends)."""
    return RunPublic(
        id=0,
        job_id=row["id"],
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        started_at=row["awaiting_since"],
        finished_at=None,
        status_code=row["last_status_code"],
        duration_ms=None,
        outcome=AWAITING_COMPLETION,
        error=None,
        deadline_at=row["async_deadline_at"],
        last_heartbeat_at=row["last_heartbeat_at"],
        progress=row["progress"],
        progress_message=row["progress_message"],
    )


def recurring(row: Any, column: str) -> Any:
    return None if row["schedule_kind"] == ScheduleKind.ONCE else row[column]


_FROM_ROW = object()


def job_public(row: Any, payload: Any = _FROM_ROW) -> JobPublic:
    """`payload` for a row read without it (lists); absent, the row's own."""
    return JobPublic(
        id=row["id"],
        key=row["schedule_key"],
        set=row["schedule_set"],
        labels=row["labels"],
        name=row["name"],
        target_id=row["target_id"],
        state=row["state"],
        payload=row.get("payload") if payload is _FROM_ROW else payload,
        priority=row["priority"],
        schedule_kind=row["schedule_kind"],
        cron=row["cron_source"] or row["cron"],
        resolved_cron=row["cron"],
        timezone=row["timezone"] if row["schedule_kind"] == ScheduleKind.CRON else None,
        every_s=row["every_s"],
        dedup_key=row["dedup_key"],
        interval_mode=row["interval_mode"] if row["schedule_kind"] == ScheduleKind.INTERVAL else None,
        misfire_policy=recurring(row, "misfire_policy"),
        misfire_grace_s=recurring(row, "misfire_grace_s"),
        catch_up_limit=recurring(row, "catch_up_limit"),
        overlap_policy=recurring(row, "overlap_policy"),
        jitter_s=recurring(row, "jitter_s"),
        start_at=row["start_at"],
        end_at=row["end_at"],
        max_runs=row["max_runs"],
        runs=row["occurrences_run"],
        ended_reason=row["ended_reason"],
        parent_job_id=row["parent_job_id"],
        next_run_at=next_run_at(row),
        scheduled_for=row["scheduled_for"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        backoff_base_s=row["backoff_base_s"],
        backoff_max_s=row["backoff_max_s"],
        backoff_factor=row["backoff_factor"],
        last_status_code=row["last_status_code"],
        last_error=row["last_error"],
        completion=row["completion"],
        async_timeout_s=row["async_timeout_s"],
        heartbeat_timeout_s=row["heartbeat_timeout_s"],
        awaiting_completion=(awaiting := is_awaiting(row)),
        # A create's row has no open-attempt columns (CREATED_COLUMNS): absent, they are null.
        deadline_at=row["async_deadline_at"] if awaiting else None,
        heartbeat_deadline_at=row["lease_expires_at"] if awaiting else None,
        last_heartbeat_at=row.get("last_heartbeat_at"),
        progress=row.get("progress"),
        progress_message=row.get("progress_message"),
        pause_requested=row.get("pause_requested_at") is not None,
        after=None if row["after_job_id"] is None else ChainLinkPublic(job_id=row["after_job_id"], on=row["after_on"]),
        payload_from=row["payload_from"],
        cause_id=None if row["cause_id"] is None else f"msg_{row['cause_id'].hex}",
        health=row["health"] if "health" in row else health_of_row(row),
        last_success_at=row["last_success_at"],
        last_failure_at=row["last_failure_at"],
        consecutive_failures=row["consecutive_failures"],
        expect=expect_public(row),
        on_success_target_id=row["on_success_target_id"],
        on_failure_target_id=row["on_failure_target_id"],
        event_type=row["event_type"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


class NamedSchedule(JobPublic):
    """A named schedule after a PUT: its job, and what the PUT changed."""

    changed: list[str] = Field(
        description="The fields the PUT changed: all it set for a new schedule, none when it matched already"
    )
