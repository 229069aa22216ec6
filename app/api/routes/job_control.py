"""/v1/jobs/{id} control: pause, resume, trigger an extra occurrence, and change a job (PATCH)."""

from __future__ import annotations

import dataclasses
import uuid

from fastapi import APIRouter
from sqlalchemy.engine import RowMapping

from app.api.audit import Audited
from app.api.checks import JOB_NOT_FOUND, existing_job
from app.api.deps import Conn, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.job_changes import change_job, state_conflict
from app.api.quota_checks import ensure_room_for_jobs
from app.api.schemas.jobs import JobPublic, JobUpdate, job_public
from app.domain.job import JobCompletion
from app.domain.job_plan import plan_one_off
from app.domain.payload import payload_json
from app.domain.states import TERMINAL_STATES
from app.store import jobs as store
from app.store.chains import job_mark_fires_children
from app.store.completions import job_request_pause, job_withdraw_pause
from app.store.job_rows import policy_from_row
from app.store.job_rows_new import PreparedJob
from app.store.targets import target_lock_live

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Audited])


async def _changed_or_conflict(
    conn: Conn, tenant_id: uuid.UUID, job_id: uuid.UUID, changed: RowMapping | None, action: str
) -> JobPublic:
    """The changed job, or why it could not be changed (404, or 409 naming its state)."""
    if changed is None:
        raise state_conflict(await existing_job(conn, tenant_id, job_id), action)
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
        raise state_conflict(row, "trigger")
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
    # The occurrence it carries is the job's: so are its callbacks.
    new = dataclasses.replace(
        new, on_success_target_id=row["on_success_target_id"], on_failure_target_id=row["on_failure_target_id"]
    )
    created = await store.job_create(conn, PreparedJob.of(new, payload_json(new.payload)))
    if row["fires_children"]:
        # The occurrence it carries fires the job's chained children when it settles.
        await job_mark_fires_children(conn, tenant_id, row["id"])
    return job_public(created)


@router.patch("/{job_id}", operation_id="updateJob")
async def update_job(
    job_id: uuid.UUID, body: JobUpdate, tenant_id: TenantId, conn: Conn, settings: SettingsDep, quotas: QuotasDep
) -> JobPublic:
    """Changes a job that is waiting (scheduled, retrying or paused); 409 while running or finished."""
    row = await store.job_lock(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, JOB_NOT_FOUND, slug="not-found")
    return job_public(await change_job(conn, tenant_id, row, body, settings, quotas))
