"""Job rows to domain values and back: schedule, recurrence and retry-policy columns, the
one projection a claimed job is read with, and the lease columns of a job no one holds."""

from __future__ import annotations

import datetime as dt
import functools
import json
import uuid
from typing import Any

from sqlalchemy import ColumnElement, Text, case, cast, func, literal_column
from sqlalchemy.engine import RowMapping

from app.domain.completion import CompletionSettings, resolve_settings
from app.domain.job import ClaimedJob
from app.domain.job_updates import JobChanges
from app.domain.occurrences import Bounds, IntervalMode, MisfirePolicy, OverlapPolicy, Recurrence
from app.domain.retry import RetryPolicy
from app.domain.schedule import CronSchedule, IntervalSchedule, OnceSchedule, Schedule, ScheduleKind, jittered
from app.keyring import SIGNING_SECRET, KeyRing
from app.store.tables import jobs, targets

_NOT_READ_ON_CLAIM = frozenset(
    {"payload", "name", "priority", "state", "ended_reason", "dedup_key", "run_at", "lease_expires_at"}
    | {"last_status_code", "last_error", "parent_job_id", "created_at", "updated_at", "finished_at"}
    # Completion: read resolved against the target's (below); an open attempt's state, never.
    | {"completion", "async_timeout_s", "heartbeat_timeout_s", "async_deadline_at", "awaiting_since"}
    | {"completion_token_hash", "last_heartbeat_at", "progress", "progress_message", "pause_requested_at"}
    # The expression as written: fire times need only the resolved one.
    | {"cron_source"}
    # A chained job is never claimed; its occurrences' settling reads the mark when written.
    | {"after_job_id", "after_on", "payload_from", "fires_children", "schedule_key", "schedule_set"}
    # Labels are for finding jobs, not delivering them.
    | {"labels"}
    # A held occurrence is never claimed (its run_at is HELD).
    | {"held_run_at"}
    # Health and events: the outcome statement reads them where it writes them.
    | {"last_success_at", "last_failure_at", "consecutive_failures", "health_alert", "event_type"}
    | {"expect_success_within_s", "expect_max_consecutive_failures", "on_success_target_id", "on_failure_target_id"}
    | {"resumed_at"}
)

# A held occurrence's run_at (its target or tenant paused, app/store/pauses.py): later than
# every claim's due range and every next-due probe's, so scans in due order never reach the
# held. The run_at it had waits in held_run_at. (asyncpg reads it as a naive datetime.max.)
HELD: ColumnElement[dt.datetime] = literal_column("'infinity'::timestamptz")

# The database's clock as a claimed row leaves the statement, where now() is the statement's
# start: a claim's own duration (~5-15 ms under load) would otherwise come off every wait for
# a due time (app/services/attempts.py). Read as ClaimedJob.sent_at.
SENT_AT = func.clock_timestamp().label("sent_at")

# What a claimed job is read with (claim and reaper alike): the job, its target's delivery
# settings, and the database's now() as `claimed_at`.
CLAIMED_JOB_COLUMNS = (
    # Only what claimed_from_row reads: every column costs decoding on each claimed row.
    *(column for column in jobs.c if column.name not in _NOT_READ_ON_CLAIM),
    # The JSON text as stored: the delivery POSTs these bytes without decoding and encoding.
    cast(jobs.c.payload, Text).label("payload_json"),
    targets.c.url,
    # As text: decoded once per target (claimed_from_row), not once per claimed row.
    cast(targets.c.headers, Text).label("headers_json"),
    targets.c.timeout_s,
    targets.c.signing_secret,
    # A rotated-out secret signs alongside the new one until its grace period ends.
    case(
        (targets.c.previous_secret_expires_at > func.now(), targets.c.previous_signing_secret),
        else_=None,
    ).label("previous_signing_secret"),
    targets.c.retry_on_status,
    targets.c.max_in_flight.label("target_max_in_flight"),
    # The job's completion settings, else its target's (app/domain/completion.py).
    func.coalesce(jobs.c.completion, targets.c.completion).label("completion_mode"),
    func.coalesce(jobs.c.async_timeout_s, targets.c.async_timeout_s).label("completion_async_timeout_s"),
    func.coalesce(jobs.c.heartbeat_timeout_s, targets.c.heartbeat_timeout_s).label("completion_heartbeat_timeout_s"),
    func.now().label("claimed_at"),
)

# The lease columns of a job no scheduler holds, with those of an open asynchronous attempt
# (which ends with its lease, however it ends).
NO_LEASE: dict[str, Any] = {
    "lease_owner": None,
    "lease_token": None,
    "lease_expires_at": None,
    "async_deadline_at": None,
    "awaiting_since": None,
    "completion_token_hash": None,
    "last_heartbeat_at": None,
    "progress": None,
    "progress_message": None,
}


def schedule_columns(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, OnceSchedule):
        return {
            "schedule_kind": ScheduleKind.ONCE,
            "cron": None,
            "cron_source": None,
            "every_s": None,
            "timezone": "UTC",
        }
    if isinstance(schedule, CronSchedule):
        return {
            "schedule_kind": ScheduleKind.CRON,
            "cron": schedule.expression,
            "cron_source": schedule.source,
            "every_s": None,
            "timezone": schedule.timezone,
        }
    return {
        "schedule_kind": ScheduleKind.INTERVAL,
        "cron": None,
        "cron_source": None,
        "every_s": schedule.every_s,
        "timezone": "UTC",
    }


def schedule_from_row(row: RowMapping) -> Schedule:
    kind = row["schedule_kind"]
    if kind == ScheduleKind.CRON:
        # The claim reads no cron_source (fire times need only the resolved expression).
        return CronSchedule(row["cron"], row["timezone"], row.get("cron_source"))
    if kind == ScheduleKind.INTERVAL:
        return IntervalSchedule(row["every_s"])
    return OnceSchedule(row["scheduled_for"])


def recurrence_from_row(row: RowMapping) -> Recurrence | None:
    schedule = schedule_from_row(row)
    if isinstance(schedule, OnceSchedule):
        return None
    return _recurrence_from_row(row, schedule)


def _recurrence_from_row(row: RowMapping, schedule: CronSchedule | IntervalSchedule) -> Recurrence:
    return Recurrence(
        schedule=schedule,
        anchor=row["schedule_anchor_at"],
        interval_mode=IntervalMode(row["interval_mode"]),
        misfire_policy=MisfirePolicy(row["misfire_policy"]),
        misfire_grace_s=row["misfire_grace_s"],
        catch_up_limit=row["catch_up_limit"],
        overlap_policy=OverlapPolicy(row["overlap_policy"]),
        jitter_s=row["jitter_s"],
        bounds=Bounds(
            _bound(row["start_at"], dt.datetime.min), _bound(row["end_at"], dt.datetime.max), row["max_runs"]
        ),
    )


def _bound(value: dt.datetime | None, unbounded: dt.datetime) -> dt.datetime | None:
    # asyncpg reads PostgreSQL's -infinity / infinity as a naive datetime.min / datetime.max
    # (rows written before bounds were range-checked); in the open direction that is no bound.
    return None if value == unbounded else value


def recurrence_columns(recurrence: Recurrence | None) -> dict[str, Any]:
    if recurrence is None:
        return {}
    return {
        "interval_mode": recurrence.interval_mode.value,
        "misfire_policy": recurrence.misfire_policy.value,
        "misfire_grace_s": recurrence.misfire_grace_s,
        "catch_up_limit": recurrence.catch_up_limit,
        "overlap_policy": recurrence.overlap_policy.value,
        "jitter_s": recurrence.jitter_s,
        "start_at": recurrence.bounds.start_at,
        "end_at": recurrence.bounds.end_at,
        "max_runs": recurrence.bounds.max_runs,
    }


def policy_from_row(row: RowMapping) -> RetryPolicy:
    return RetryPolicy(row["max_attempts"], row["backoff_base_s"], row["backoff_max_s"], row["backoff_factor"])


def policy_columns(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": policy.max_attempts,
        "backoff_base_s": policy.backoff_base_s,
        "backoff_max_s": policy.backoff_max_s,
        "backoff_factor": policy.backoff_factor,
    }


def claimed_from_row(row: RowMapping, key_ring: KeyRing) -> ClaimedJob:
    """A row read with CLAIMED_JOB_COLUMNS; `key_ring` opens its target's secrets."""
    schedule = schedule_from_row(row)
    retry_on_status = row["retry_on_status"]
    target = _target_settings(
        key_ring,
        row["url"],
        row["headers_json"],
        row["timeout_s"],
        row["signing_secret"],
        row["previous_signing_secret"],
        None if retry_on_status is None else tuple(retry_on_status),
        row["target_max_in_flight"],
    )
    return ClaimedJob(
        id=row["id"],
        partition=row["partition"],
        tenant_id=row["tenant_id"],
        target_id=row["target_id"],
        payload_json=row["payload_json"],
        schedule=schedule,
        schedule_anchor_at=row["schedule_anchor_at"],
        scheduled_for=row["scheduled_for"],
        occurrence_id=row["occurrence_id"],
        attempt=row["attempt"],
        policy=policy_from_row(row),
        lease_token=row["lease_token"],
        lease_owner=row["lease_owner"],
        claimed_at=row["claimed_at"],
        occurrence_claimed_at=row["occurrence_claimed_at"],
        recurrence=None if isinstance(schedule, OnceSchedule) else _recurrence_from_row(row, schedule),
        occurrences_run=row["occurrences_run"],
        cause_id=row["cause_id"],
        # The claim's own rows carry the run_at it found (app/store/claims.py); others do not.
        due_at=row.get("candidate_run_at"),
        sent_at=row.get("sent_at"),
        completion=_completion(
            row["completion_mode"], row["completion_async_timeout_s"], row["completion_heartbeat_timeout_s"]
        ),
        **target,
    )


@functools.lru_cache(maxsize=256)
def _completion(mode: str | None, async_timeout_s: int | None, heartbeat_timeout_s: int | None) -> CompletionSettings:
    return resolve_settings(mode, async_timeout_s, heartbeat_timeout_s, None, None, None)


@functools.lru_cache(maxsize=4096)
def _target_settings(
    key_ring: KeyRing,
    url: str,
    headers_json: str | None,
    timeout_s: float,
    signing_secret: str,
    previous_signing_secret: str | None,
    retry_on_status: tuple[int, ...] | None,
    max_in_flight: int | None,
) -> dict[str, Any]:
    """A claimed job's target fields, the same for every job of one target version: opened
    (secrets and header values unsealed, app/keyring.py) once and shared by its jobs, which
    never change them. Keyed by the stored values (and the ring, by identity), so an edited
    or rotated target is a new entry."""
    return {
        "url": url,
        "headers": key_ring.open_headers((json.loads(headers_json) if headers_json else None) or {}),
        "timeout_s": timeout_s,
        "signing_secret": key_ring.open(signing_secret, SIGNING_SECRET),
        "previous_signing_secret": (
            None if previous_signing_secret is None else key_ring.open(previous_signing_secret, SIGNING_SECRET)
        ),
        "retry_on_status": None if retry_on_status is None else frozenset(retry_on_status),
        "target_max_in_flight": max_in_flight,
    }


def job_is_held(row: RowMapping) -> bool:
    """Whether a jobs row (all its columns) is an occurrence held while its target is paused."""
    run_at: dt.datetime | None = row["run_at"]
    return run_at is not None and run_at.year == dt.MAXYEAR and row["held_run_at"] is not None


def next_run_at(row: RowMapping) -> dt.datetime | None:
    """When a job next becomes due, as a read shows it: a held occurrence's own time (it is
    due then, or at the resume), never HELD."""
    due: dt.datetime | None = row["held_run_at"] if job_is_held(row) else row["run_at"]
    return due


def job_change_columns(changes: JobChanges, job_id: uuid.UUID) -> dict[str, Any]:
    """The columns a planned change (app/domain/job_updates.py) writes."""
    columns: dict[str, Any] = {}
    if changes.policy is not None:
        columns.update(policy_columns(changes.policy))
    columns.update(recurrence_columns(changes.recurrence))
    new = changes.rescheduled
    if new is not None:
        columns.update(
            **schedule_columns(new.schedule),
            **recurrence_columns(new.recurrence),
            schedule_anchor_at=new.anchor_at,
            scheduled_for=new.first_fire_at,
            occurrence_id=uuid.uuid4(),
            attempt=0,
        )
        if new.state is not None:
            jitter_s = 0 if new.recurrence is None else new.recurrence.jitter_s
            columns.update(state=new.state, run_at=jittered(job_id, new.first_fire_at, jitter_s))
    return columns
