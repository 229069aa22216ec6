"""/v1/jobs: scheduling, reading, cancelling jobs and reading their runs."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.audit import Audited, set_audit_object
from app.api.checks import JOB_NOT_FOUND, ensure_payload_fits, existing_job, require_live_target
from app.api.deps import Conn, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.quota_checks import ensure_job_within_quotas
from app.api.schemas.jobs import JobCreate, JobPublic, RunPublic, job_public
from app.api.schemas.pages import IncludePayload, Page, page_of, rows_within_budget
from app.domain.job_plan import plan_create
from app.domain.states import JobState
from app.store import jobs as store
from app.store.jobs import db_now
from app.store.pagination import decode_int_cursor, decode_time_id_cursor, encode_cursor
from app.store.runs import run_list_for_job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Audited])


@router.post("", status_code=201, operation_id="createJob", responses=REPLAYED_RESPONSE_DOC)
async def create_job(
    body: JobCreate,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    request: Request,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    idempotent = IdempotentRequest(conn, tenant_id, "POST /v1/jobs", idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        return JobPublic.model_validate(replay.apply(response))
    ensure_payload_fits(body.payload, settings)
    now = await db_now(conn)
    new = plan_create(body, tenant_id, settings.default_retry_policy, now)
    await ensure_job_within_quotas(conn, quotas, tenant_id, new.schedule, new.policy, now)
    await require_live_target(conn, tenant_id, body.target_id)
    if new.dedup_key is None:
        row = await store.job_create(conn, new)
    else:
        created, holder = await store.job_create_unless_duplicate(conn, new)
        if created is None:
            raise Problem(
                409,
                f"an unfinished job already has this dedup_key: {holder}",
                slug="duplicate-job",
                field="dedup_key",
                extra={"job_id": str(holder)},
            )
        row = created
    job = job_public(row)
    set_audit_object(request, job.id)
    await idempotent.finish(201, job)
    return job


@router.get("", operation_id="listJobs")
async def list_jobs(
    tenant_id: TenantId,
    conn: Conn,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
    parent_job_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
    include: IncludePayload = None,
) -> Page[JobPublic]:
    """Newest first. Payloads (null here by default) come with `include=payload`; a page then
    ends early, with a `next_cursor`, once its payloads reach PAGE_PAYLOAD_BUDGET bytes."""
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.job_list(
        conn,
        tenant_id,
        limit + 1,
        after,
        state=state,
        target_id=target_id,
        parent_job_id=parent_job_id,
        with_payload=False,
        with_payload_bytes=include is not None,
    )
    if include is None:
        return page_of(rows, limit, job_public)
    rows, limit = rows_within_budget(rows, limit)
    payloads = await store.job_payloads(conn, tenant_id, [row["id"] for row in rows[:limit]])
    return page_of(rows, limit, lambda row: job_public(row, payloads.get(row["id"])))


@router.get("/{job_id}", operation_id="getJob")
async def get_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    return job_public(await existing_job(conn, tenant_id, job_id))


@router.post("/{job_id}/cancel", operation_id="cancelJob")
async def cancel_job(job_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> JobPublic:
    row = await store.job_cancel(conn, tenant_id, job_id)
    if row is not None:
        return job_public(row)
    existing = await existing_job(conn, tenant_id, job_id)
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
        raise Problem(404, JOB_NOT_FOUND, slug="not-found")
    return page_of(rows, limit, lambda row: RunPublic.model_validate(dict(row)), lambda row: encode_cursor(row["id"]))
