"""/v1/jobs/{id} control: pause, resume, trigger an extra occurrence, and change a job (PATCH)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter
from sqlalchemy.engine import RowMapping

from app.api.audit import Audited
from app.api.chains import lock_parent
from app.api.checks import JOB_NOT_FOUND, ensure_payload_fits, existing_job, require_live_target
from app.api.deps import Conn, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.quota_checks import ensure_job_within_quotas, ensure_room_for_jobs
from app.api.schemas.jobs import JobPublic, JobUpdate, job_public
from app.domain.chains import ChainOn
from app.domain.job import JobCompletion
from app.domain.job_plan import COMPLETION_FIELDS, RECURRENCE_FIELDS, SCHEDULE_FIELDS, plan_one_off, plan_update
from app.domain.payload import payload_json
from app.domain.schedule import ScheduleKind, hash_seed
from app.domain.states import CHANGEABLE_STATES, TERMINAL_STATES, JobState
from app.store import jobs as store
from app.store.chains import job_mark_fires_children
from app.store.completions import job_request_pause, job_withdraw_pause
from app.store.job_rows import job_change_columns, policy_from_row, recurrence_from_row, schedule_from_row
from app.store.job_rows_new import PreparedJob
from app.store.targets import target_lock_live

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Audited])


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


async def _changed_or_conflict(
    conn: Conn, tenant_id: uuid.UUID, job_id: uuid.UUID, changed: RowMapping | None, action: str
) -> JobPublic:
    """The changed job, or why it could not be changed (404, or 409 naming its state)."""
    if changed is None:
        raise _conflict(await existing_job(conn, tenant_id, job_id), action)
    return job_public(changed)


@router.post("/{job_id}/pause", operation_id="pauseJob")
async def pause_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    """Stops a scheduled or retrying job from firing until resumed (409 while a delivery is in
    flight, or finished). While an async attempt is open, the pause waits for it: the job
    shows `pause_requested` and is paused when the attempt ends."""
    changed = await store.job_pause(conn, tenant_id, job_id) or await job_request_pause(conn, tenant_id, job_id)
    return await _changed_or_conflict(conn, tenant_id, job_id, changed, "pause")


@router.post("/{job_id}/resume", operation_id="resumeJob")
async def resume_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    """Makes a paused job due again; fire times missed while paused follow its misfire policy."""
    changed = await store.job_resume(conn, tenant_id, job_id) or await job_withdraw_pause(conn, tenant_id, job_id)
    return await _changed_or_conflict(conn, tenant_id, job_id, changed, "resume")


@router.post("/{job_id}/trigger", status_code=201, operation_id="triggerJob")
async def trigger_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn, quotas: QuotasDep) -> JobPublic:
    """One extra occurrence now, without shifting the job's own schedule.

    Returns the one-off job that carries it: same target, payload, priority and retry policy.
    """
    row = await existing_job(conn, tenant_id, job_id)
    if row["state"] in TERMINAL_STATES:
        raise _conflict(row, "trigger")
    if not await target_lock_live(conn, tenant_id, row["target_id"]):
        raise Problem(409, "the job's target was deleted", slug="target-deleted")
    await ensure_room_for_jobs(conn, quotas, tenant_id, 1)
    new = plan_one_off(
        tenant_id=tenant_id,
        target_id=row["target_id"],
        name=row["name"],
        payload=row["payload"],
        priority=row["priority"],
        policy=policy_from_row(row),
        due=await store.db_now(conn),
        parent_job_id=row["id"],
        completion=JobCompletion(row["completion"], row["async_timeout_s"], row["heartbeat_timeout_s"]),
    )
    created = await store.job_create(conn, PreparedJob.of(new, payload_json(new.payload)))
    if row["fires_children"]:
        # The occurrence it carries fires the job's chained children when it settles.
        await job_mark_fires_children(conn, tenant_id, row["id"])
    return job_public(created)


async def _chain_changes(conn: Conn, tenant_id: uuid.UUID, row: RowMapping, body: JobUpdate) -> dict[str, Any]:
    """What a PATCH changes of a chained job's link (after, payload_from). A chained job takes
    no schedule, and a scheduled job does not become a chained one (create one instead)."""
    given = body.model_fields_set
    chained = row["schedule_kind"] == ScheduleKind.AFTER
    if not chained:
        for name in ("after", "payload_from"):
            if name in given:
                raise Problem(
                    422, "applies only to a chained job: create one with after", slug="validation", field=name
                )
        return {}
    for name in (*sorted(SCHEDULE_FIELDS), *RECURRENCE_FIELDS):
        if name in given:
            raise Problem(
                422, "a chained job runs when its parent settles: it takes no schedule", slug="validation", field=name
            )
    changes: dict[str, Any] = {}
    if "after" in given:
        if body.after is None:
            raise Problem(422, "a chained job needs its parent: cancel it instead", slug="validation", field="after")
        if body.after.job_id != row["after_job_id"]:
            await lock_parent(conn, tenant_id, body.after.job_id, child_id=row["id"])
            await job_mark_fires_children(conn, tenant_id, body.after.job_id)
        changes.update(after_job_id=body.after.job_id, after_on=(body.after.on or ChainOn.SUCCESS).value)
    if "payload_from" in given:
        changes["payload_from"] = body.payload_from
    return changes


@router.patch("/{job_id}", operation_id="updateJob")
async def update_job(
    job_id: uuid.UUID, body: JobUpdate, tenant_id: TenantId, conn: Conn, settings: SettingsDep, quotas: QuotasDep
) -> JobPublic:
    """Changes a job that is waiting (scheduled, retrying or paused); 409 while running or finished."""
    row = await store.job_lock(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, JOB_NOT_FOUND, slug="not-found")
    state: JobState = row["state"]
    if state not in CHANGEABLE_STATES:
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
        await require_live_target(conn, tenant_id, body.target_id)
        changes["target_id"] = body.target_id
    changes.update(await _chain_changes(conn, tenant_id, row, body))
    now = await store.db_now(conn)
    planned = plan_update(
        body,
        seed=hash_seed(tenant_id, row["id"]),
        state=state,
        attempts_made=row["attempt"],
        policy=policy_from_row(row),
        schedule=schedule_from_row(row),
        recurrence=lambda: recurrence_from_row(row),
        now=now,
    )
    if planned.policy is not None or planned.rescheduled is not None:
        schedule = planned.rescheduled.schedule if planned.rescheduled is not None else schedule_from_row(row)
        policy = planned.policy or policy_from_row(row)
        await ensure_job_within_quotas(conn, quotas, tenant_id, schedule, policy, now, new_jobs=0)
    changes.update(job_change_columns(planned, row["id"]))
    # The job's own completion settings: from its next attempt (an open one keeps its own).
    changes.update({name: getattr(body, name) for name in COMPLETION_FIELDS if name in given})
    if not changes:
        return job_public(row)
    updated = await store.job_update(conn, job_id, state, changes)
    assert updated is not None, "the row is locked: its state cannot have changed"
    return job_public(updated)
