"""/v1/jobs/{id} control: pause, resume, trigger an extra occurrence, and change a job (PATCH)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter
from sqlalchemy.engine import RowMapping

from app.api.deps import Conn, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.routes.jobs import NOT_FOUND, RECURRENCE_FIELDS, ensure_payload_fits, plan_recurrence, retry_policy
from app.api.schemas import JobPublic, JobUpdate, job_public
from app.domain.job import NewJob
from app.domain.schedule import OnceSchedule, ScheduleError, resolve_schedule
from app.domain.states import TERMINAL_STATES, JobState
from app.store import jobs as store
from app.store.job_rows import (
    policy_columns,
    policy_from_row,
    recurrence_columns,
    recurrence_from_row,
    schedule_columns,
    schedule_from_row,
)
from app.store.targets import target_lock_live

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

SCHEDULE_FIELDS = frozenset({"run_at", "delay_s", "cron", "timezone", "every_s"})
POLICY_FIELDS = frozenset({"max_attempts", "backoff_base_s", "backoff_max_s", "backoff_factor"})
BOUND_FIELDS = frozenset({"start_at", "end_at", "max_runs"})


def _conflict(row: RowMapping, action: str) -> Problem:
    state: JobState = row["state"]
    if state == JobState.RUNNING:
        detail = f"cannot {action} while an occurrence is being delivered; retry when it finishes"
        slug = "job-running"
    elif state in TERMINAL_STATES:
        detail, slug = f"cannot {action} a job that is already {state.value}", "job-finished"
    else:
        detail, slug = f"cannot {action} a job that is {state.value}", "job-state"
    return Problem(409, detail, slug=slug, extra={"state": state.value})


async def _existing(conn: Conn, tenant_id: uuid.UUID, job_id: uuid.UUID) -> RowMapping:
    row = await store.job_get(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return row


@router.post("/{job_id}/pause", operation_id="pauseJob")
async def pause_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    """Stops a scheduled or retrying job from firing until resumed (409 while running or finished)."""
    row = await store.job_pause(conn, tenant_id, job_id)
    if row is None:
        raise _conflict(await _existing(conn, tenant_id, job_id), "pause")
    return job_public(row)


@router.post("/{job_id}/resume", operation_id="resumeJob")
async def resume_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    """Makes a paused job due again; fire times missed while paused follow its misfire policy."""
    row = await store.job_resume(conn, tenant_id, job_id)
    if row is None:
        raise _conflict(await _existing(conn, tenant_id, job_id), "resume")
    return job_public(row)


@router.post("/{job_id}/trigger", status_code=201, operation_id="triggerJob")
async def trigger_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    """One extra occurrence now, without shifting the job's own schedule.

    Returns the one-off job that carries it: same target, payload, priority and retry policy.
    """
    row = await _existing(conn, tenant_id, job_id)
    if row["state"] in TERMINAL_STATES:
        raise _conflict(row, "trigger")
    if not await target_lock_live(conn, tenant_id, row["target_id"]):
        raise Problem(409, "the job's target was deleted", slug="target-deleted")
    now = await store.db_now(conn)
    new = await store.job_create(
        conn,
        NewJob(
            tenant_id=tenant_id,
            target_id=row["target_id"],
            name=row["name"],
            payload=row["payload"],
            priority=row["priority"],
            schedule=OnceSchedule(now),
            first_fire_at=now,
            policy=policy_from_row(row),
            parent_job_id=row["id"],
        ),
    )
    return job_public(new)


@router.patch("/{job_id}", operation_id="updateJob")
async def update_job(
    job_id: uuid.UUID, body: JobUpdate, tenant_id: TenantId, conn: Conn, settings: SettingsDep
) -> JobPublic:
    """Changes a job that is waiting (scheduled, retrying or paused); 409 while running or finished."""
    row = await store.job_lock(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    state: JobState = row["state"]
    if state not in (JobState.SCHEDULED, JobState.RETRYING, JobState.PAUSED):
        raise _conflict(row, "change")
    given = body.model_fields_set
    if "dedup_key" in given:
        raise Problem(422, "a job's dedup_key is set when it is created", slug="validation", field="dedup_key")
    changes: dict[str, Any] = {}
    if "payload" in given:
        ensure_payload_fits(body.payload, settings)
        changes["payload"] = body.payload
    if "name" in given:
        changes["name"] = body.name
    if "priority" in given:
        changes["priority"] = body.priority
    if "target_id" in given:
        if body.target_id is None:
            raise Problem(422, "a job needs a target", slug="validation", field="target_id")
        if not await target_lock_live(conn, tenant_id, body.target_id):
            raise Problem(422, "no such target", slug="validation", field="target_id")
        changes["target_id"] = body.target_id
    if given & POLICY_FIELDS:
        # A new schedule or new bounds start a fresh occurrence, with no attempts made yet.
        fresh_occurrence = bool(given & (SCHEDULE_FIELDS | BOUND_FIELDS))
        changes.update(_policy_changes(body, row, 0 if fresh_occurrence else row["attempt"]))
    if given & (SCHEDULE_FIELDS | set(RECURRENCE_FIELDS)):
        changes.update(await _schedule_changes(conn, body, row, state))
    if not changes:
        return job_public(row)
    updated = await store.job_update(conn, job_id, state, changes)
    assert updated is not None, "the row is locked: its state cannot have changed"
    return job_public(updated)


def _policy_changes(body: JobUpdate, row: RowMapping, attempts_made: int) -> dict[str, Any]:
    policy = retry_policy(body, policy_from_row(row))
    # A waiting job with attempts made has a retry pending, which will be one more attempt.
    if attempts_made and policy.max_attempts <= attempts_made:
        raise Problem(
            422,
            f"must be more than the {attempts_made} attempts already made: a retry is pending "
            "(cancel the job to stop it)",
            slug="validation",
            field="max_attempts",
        )
    return policy_columns(policy)


async def _schedule_changes(conn: Conn, body: JobUpdate, row: RowMapping, state: JobState) -> dict[str, Any]:
    given = body.model_fields_set
    now = await store.db_now(conn)
    if given & SCHEDULE_FIELDS:
        cron, timezone = body.cron, body.timezone
        sent = sorted(given & SCHEDULE_FIELDS)
        if all(getattr(body, field) is None for field in sent):
            raise ScheduleError(sent[0], "a job's schedule can be replaced, not removed")
        if sent == ["timezone"] and row["schedule_kind"] != "cron":
            raise ScheduleError("timezone", "applies only to a cron schedule")
        if row["schedule_kind"] == "cron":
            if cron is None and timezone is not None:
                cron = row["cron"]  # a new time zone for the same expression
            if cron is not None and "timezone" not in given:
                timezone = row["timezone"]  # a new expression in the job's own time zone
        schedule, first_fire_at = resolve_schedule(
            run_at=body.run_at, delay_s=body.delay_s, cron=cron, timezone=timezone, every_s=body.every_s, now=now
        )
    else:
        schedule, first_fire_at = schedule_from_row(row), row["scheduled_for"]
    recurrence, anchor_at, first_fire_at = plan_recurrence(body, schedule, first_fire_at, now, recurrence_from_row(row))
    policy_only = not given & (SCHEDULE_FIELDS | BOUND_FIELDS)
    if policy_only:
        # Misfire and overlap policies apply from the next claim; the schedule stands.
        return recurrence_columns(recurrence)
    # A new schedule or new bounds start a new occurrence: fresh attempts, a new webhook-id.
    changes: dict[str, Any] = {
        **schedule_columns(schedule),
        **recurrence_columns(recurrence),
        "schedule_anchor_at": anchor_at,
        "scheduled_for": first_fire_at,
        "occurrence_id": uuid.uuid4(),
        "attempt": 0,
    }
    if state != JobState.PAUSED:
        changes.update(state=JobState.SCHEDULED, run_at=first_fire_at)
    return changes
