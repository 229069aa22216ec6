"""/v1/jobs: scheduling, reading, cancelling jobs and reading their runs."""

from __future__ import annotations

import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import Conn, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.schemas import JobCreate, JobPublic, Page, RunPublic, job_public, page_of
from app.domain.retry import RetryPolicy
from app.domain.schedule import resolve_schedule
from app.domain.states import JobState
from app.settings import Settings
from app.store import jobs as store
from app.store.pagination import decode_int_cursor, decode_time_id_cursor, encode_cursor
from app.store.runs import run_list_for_job
from app.store.targets import target_lock_live

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

NOT_FOUND = "job not found"


def ensure_payload_fits(payload: object, settings: Settings) -> None:
    payload_size = len(json.dumps(payload, separators=(",", ":")).encode())
    if payload_size > settings.max_payload_bytes:
        raise Problem(
            413,
            f"payload is {payload_size} bytes; the limit is {settings.max_payload_bytes} (CRONHOOK_MAX_PAYLOAD_BYTES)",
            slug="payload-too-large",
            field="payload",
        )


@router.post("", status_code=201, operation_id="createJob")
async def create_job(body: JobCreate, tenant_id: TenantId, conn: Conn, settings: SettingsDep) -> JobPublic:
    ensure_payload_fits(body.payload, settings)
    policy = RetryPolicy(
        max_attempts=body.max_attempts or settings.default_max_attempts,
        backoff_base_s=body.backoff_base_s or settings.default_backoff_base_s,
        backoff_max_s=body.backoff_max_s or settings.default_backoff_max_s,
        backoff_factor=body.backoff_factor or settings.default_backoff_factor,
    )
    if policy.backoff_max_s < policy.backoff_base_s:
        raise Problem(422, "must be at least backoff_base_s", slug="validation", field="backoff_max_s")
    now = await store.db_now(conn)
    schedule, first_fire_at = resolve_schedule(
        run_at=body.run_at,
        delay_s=body.delay_s,
        cron=body.cron,
        timezone=body.timezone,
        every_s=body.every_s,
        now=now,
    )
    # Unknown and foreign targets look the same: a tenant learns nothing of others' ids.
    if not await target_lock_live(conn, tenant_id, body.target_id):
        raise Problem(422, "no such target", slug="validation", field="target_id")
    row = await store.job_create(
        conn,
        store.NewJob(
            tenant_id=tenant_id,
            target_id=body.target_id,
            name=body.name,
            payload=body.payload,
            priority=body.priority,
            schedule=schedule,
            first_fire_at=first_fire_at,
            policy=policy,
        ),
    )
    return job_public(row)


@router.get("", operation_id="listJobs")
async def list_jobs(
    tenant_id: TenantId,
    conn: Conn,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[JobPublic]:
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.job_list(conn, tenant_id, limit + 1, after, state=state, target_id=target_id)
    return page_of(rows, limit, job_public)


@router.get("/{job_id}", operation_id="getJob")
async def get_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    row = await store.job_get(conn, tenant_id, job_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return job_public(row)


@router.post("/{job_id}/cancel", operation_id="cancelJob")
async def cancel_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    row = await store.job_cancel(conn, tenant_id, job_id)
    if row is not None:
        return job_public(row)
    existing = await store.job_get(conn, tenant_id, job_id)
    if existing is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    raise Problem(
        409,
        f"job is already {existing['state'].value}",
        slug="job-finished",
        extra={"state": existing["state"].value},
    )


@router.get("/{job_id}/runs", operation_id="listJobRuns")
async def list_runs(
    job_id: uuid.UUID,
    tenant_id: TenantId,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: str | None = None,
) -> Page[RunPublic]:
    after = decode_int_cursor(cursor) if cursor else None
    rows = await run_list_for_job(conn, tenant_id, job_id, limit + 1, after)
    if rows is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return page_of(rows, limit, lambda row: RunPublic.model_validate(dict(row)), lambda row: encode_cursor(row["id"]))
