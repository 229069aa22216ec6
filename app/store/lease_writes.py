"""Jobs, the writes made on behalf of a claim: each guarded by the lease it holds (the job
still running under that lease token, `_leased`), so a claim the reaper rescued, or a job
cancelled meanwhile, is left as it is. Quarantine (a row the code cannot load), hand back (no
POST was made), hand off (an occurrence to a child job) and settle (a misfire plan); the
outcome of a delivery is app/store/outcomes.py's. A write that matches no row lost a race:
the caller logs it and moves on, never retries it blindly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any

from sqlalchemy import case, cast, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.elements import ColumnElement

from app.db.async_engine import AsyncConnection
from app.domain.fire_times import Skipped
from app.domain.job import ClaimedJob, RunOutcome
from app.domain.occurrences import EndReason
from app.domain.partition import partition_for
from app.domain.schedule import OnceSchedule, jittered
from app.domain.states import JobState
from app.logs import log_event
from app.store.job_rows import NO_LEASE, schedule_columns
from app.store.outcomes import MISSED_REASON, skipped_run_values
from app.store.runs import run_insert_many
from app.store.tables import job_state, jobs

# The claim's logger, as before these writes had a module of their own (log filters name it).
logger = logging.getLogger("app.store.claims")


def _leased(job_id: uuid.UUID, lease_token: uuid.UUID) -> list[ColumnElement[bool]]:
    """The guard of every write on behalf of a claim: the job is still running under that lease."""
    return [jobs.c.id == job_id, jobs.c.state == JobState.RUNNING, jobs.c.lease_token == lease_token]


async def job_quarantine(conn: AsyncConnection, job_id: uuid.UUID, lease_token: uuid.UUID, error: str) -> None:
    """Pauses a claimed job whose row could not be turned into a delivery (data the code no
    longer accepts), with the reason in last_error, so that a user can PATCH and resume it."""
    reason = f"paused: cronhook could not load this job ({error}); fix it with PATCH, then resume"
    await conn.execute(
        update(jobs)
        .where(*_leased(job_id, lease_token))
        .values(
            state=JobState.PAUSED,
            attempt=jobs.c.attempt - 1,
            run_at=None,
            **NO_LEASE,
            last_error=reason,
            updated_at=func.now(),
        )
    )
    log_event(logger, "job_quarantined", logging.ERROR, job_id=str(job_id), error=error.split(":")[0])


def _unstarted_claim_handed_back(run_at: Any = None) -> dict[str, Any]:
    """A claim handed back before any POST: waiting again at once (or at `run_at`), the
    attempt not counted."""
    return {
        "state": case(
            (jobs.c.attempt > 1, cast(literal(JobState.RETRYING.value), job_state)),
            else_=cast(literal(JobState.SCHEDULED.value), job_state),
        ),
        "attempt": jobs.c.attempt - 1,
        "run_at": func.now() if run_at is None else run_at,
        **NO_LEASE,
        "updated_at": func.now(),
    }


async def job_release_claim(conn: AsyncConnection, job: ClaimedJob) -> bool:
    """Hands an unstarted claim back (no POST was made): the attempt is not counted."""
    stmt = (
        update(jobs)
        .where(*_leased(job.id, job.lease_token))
        .values(**_unstarted_claim_handed_back())
        .returning(jobs.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def job_release_unanswered_claim(
    conn: AsyncConnection,
    owner: str,
    answered_db_now: dt.datetime,
    lease_s: float,
    in_flight: list[uuid.UUID],
    ahead_s: float = 0.0,
) -> int:
    """Hands back what a claim whose answer was lost leased to `owner` (the connection died
    around its commit). No POST was made for those jobs, so, as job_release_claim, the
    attempt is not counted. They are `owner`'s running jobs not in flight whose lease is
    newer than any it saw (those end by `answered_db_now` + `lease_s`; nothing extends a
    lease) and still unexpired (an expired one is the reaper's, which counts the attempt).
    The lease cleared their run_at, and the claim may have taken them up to `ahead_s` before
    it was due (SchedulerConfig.claim_ahead_s): they wait again until the claim's time (their
    lease's start) plus `ahead_s`, so that no later claim POSTs one early.
    Not a hot path: built per call."""
    conditions = [
        jobs.c.state == JobState.RUNNING,
        jobs.c.lease_owner == owner,
        jobs.c.lease_expires_at > answered_db_now + dt.timedelta(seconds=lease_s),
        jobs.c.lease_expires_at > func.now(),
    ]
    if in_flight:
        conditions.append(jobs.c.lease_token.not_in(in_flight))
    claimed_at = jobs.c.lease_expires_at - dt.timedelta(seconds=lease_s)
    not_before = func.greatest(func.now(), claimed_at + dt.timedelta(seconds=ahead_s))
    stmt = update(jobs).where(*conditions).values(**_unstarted_claim_handed_back(not_before)).returning(jobs.c.id)
    return len((await conn.execute(stmt)).all())


async def job_hand_off_occurrence(
    conn: AsyncConnection, job: ClaimedJob, next_at: dt.datetime | None, ended: EndReason | None
) -> ClaimedJob | None:
    """Moves a claimed recurring job's occurrence to a one-off child job, so the next
    occurrence can start while this one is in flight (overlap_policy allow).

    The child takes over the claim as it is (running, the same lease token, expiry, attempt
    and webhook-id), so the delivery, its retries and its dead letter are the child's, and a
    target's in-flight count does not change. The parent counts the occurrence as run and
    waits for `next_at`, or ends (succeeded, `ended`) when there is none. Guarded by the
    parent's lease token: returns the child to deliver, or None when the lease was lost.
    """
    child_id = uuid.uuid4()
    guard = _leased(job.id, job.lease_token)
    copied = ["tenant_id", "target_id", "name", "payload", "priority", "state", "occurrence_id", "attempt"]
    copied += ["occurrence_claimed_at", "max_attempts", "backoff_base_s", "backoff_max_s", "backoff_factor"]
    copied += ["lease_owner", "lease_token", "lease_expires_at", "completion", "async_timeout_s"]
    copied += ["heartbeat_timeout_s", "fires_children", "on_success_target_id", "on_failure_target_id"]
    fixed: dict[str, Any] = {
        "id": child_id,
        "partition": partition_for(child_id),
        **schedule_columns(OnceSchedule(job.scheduled_for)),
        "schedule_anchor_at": job.scheduled_for,
        "scheduled_for": job.scheduled_for,
        "parent_job_id": job.id,
    }
    columns = [*copied, *fixed]
    source = select(
        *(jobs.c[name] for name in copied), *(literal(value, jobs.c[name].type) for name, value in fixed.items())
    )
    inserted = await conn.execute(insert(jobs).from_select(columns, source.where(*guard)).returning(jobs.c.id))
    if inserted.first() is None:
        return None
    parent = {**_next_occurrence_values(job, next_at, ended), "occurrence_claimed_at": None}
    parent["occurrences_run"] = jobs.c.occurrences_run + 1
    await conn.execute(update(jobs).where(*guard).values(**parent, updated_at=func.now()))
    return dataclasses.replace(
        job,
        id=child_id,
        partition=fixed["partition"],
        schedule=OnceSchedule(job.scheduled_for),
        schedule_anchor_at=job.scheduled_for,
        recurrence=None,
        occurrences_run=0,
    )


async def job_settle_due_plan(
    conn: AsyncConnection,
    job: ClaimedJob,
    missed: Skipped,
    deliver_at: dt.datetime | None,
    next_at: dt.datetime | None,
    ended: EndReason | None,
) -> bool:
    """Applies a misfire decision to a claimed recurring job, guarded by its lease token.

    With `deliver_at`, the claimed occurrence becomes the one due then (the delivery follows).
    Without, nothing is delivered: the job waits for `next_at`, or ends (succeeded, with
    `ended`) when there is none. Missed fire times are recorded as `missed` runs, and count
    against the job's health as failed occurrences (app/domain/health.py).
    Returns False when the lease was lost meanwhile (nothing is written).
    """
    guard = _leased(job.id, job.lease_token)
    values = {"scheduled_for": deliver_at} if deliver_at is not None else _next_occurrence_values(job, next_at, ended)
    if missed.total:
        values.update(_missed_values(missed.total))
    stmt = update(jobs).where(*guard).values(**values, updated_at=func.now()).returning(jobs.c.id)
    if (await conn.execute(stmt)).first() is None:
        return False
    rows = skipped_run_values(job, missed, RunOutcome.MISSED, MISSED_REASON)
    if rows:
        await run_insert_many(conn, rows)
    return True


def _missed_values(count: int) -> dict[str, Any]:
    """Health bookkeeping for fire times the misfire policy gave up: each a failed occurrence
    (a failure streak grows by them, as by a dead-lettered one; a success ends it)."""
    # Fire times kept from running by a deliberate pause (the occurrence came due before the
    # job, its target or its tenant was resumed) do not count.
    paused_away = func.coalesce(jobs.c.resumed_at > jobs.c.scheduled_for, False)
    return {
        "consecutive_failures": jobs.c.consecutive_failures + case((paused_away, 0), else_=count),
        "last_failure_at": case((paused_away, jobs.c.last_failure_at), else_=func.now()),
    }


def _next_occurrence_values(job: ClaimedJob, next_at: dt.datetime | None, ended: EndReason | None) -> dict[str, Any]:
    """A recurring job released from its claim: waiting for `next_at` (its jitter after) as a
    new occurrence, or ended (succeeded, `ended`) when there is none."""
    if next_at is not None:
        jitter_s = 0 if job.recurrence is None else job.recurrence.jitter_s
        run_at = jittered(job.id, next_at, jitter_s)
        waiting = {"state": JobState.SCHEDULED, "run_at": run_at, "scheduled_for": next_at}
        values: dict[str, Any] = {**waiting, "occurrence_id": uuid.uuid4()}
    else:
        values = {"state": JobState.SUCCEEDED, "ended_reason": ended or "schedule", "finished_at": func.now()}
    return {**values, "attempt": 0, **NO_LEASE}
