"""/v1/jobs: scheduling, reading, cancelling jobs and reading their runs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from app.api.audit import Audited, request_id_of
from app.api.checks import JOB_NOT_FOUND, ensure_payload_fits, existing_job
from app.api.deps import Conn, CreateConn, Creator, QuotasDep, SettingsDep, TenantId, fresh_connection
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_HEADER, REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.quota_checks import ensure_job_within_quotas
from app.api.quotas import Quotas
from app.api.schemas.jobs import JobCreate, JobPublic, RunPublic, job_public
from app.api.schemas.pages import IncludePayload, Page, page_of, rows_within_budget
from app.db.errors import is_transient_db_error
from app.domain.job_plan import PlanError, plan_create
from app.domain.schedule import ScheduleError
from app.domain.states import JobState
from app.settings import Settings
from app.store import jobs as store
from app.store.audit import audit_append
from app.store.job_inserts import JobAudit, NotCreated, job_create_checked, job_create_for_key
from app.store.job_layout import PreparedJob
from app.store.pagination import decode_int_cursor, decode_time_id_cursor, encode_cursor
from app.store.runs import run_list_for_job
from app.store.tenants import Caller as KeyMatch

# The create writes its own audit row (with the job, see below); the other mutations carry
# the `Audited` dependency, which would take a second connection here.
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
CREATE_JOB = "createJob"


@router.post("", status_code=201, operation_id=CREATE_JOB, response_model=JobPublic, responses=REPLAYED_RESPONSE_DOC)
async def create_job(
    body: JobCreate,
    creator: Creator,
    conn: CreateConn,
    settings: SettingsDep,
    quotas: QuotasDep,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    # Round trips without a key: the key look-up (with the clock), then one INSERT that
    # share-locks the target and honours dedup_key, both in autocommit.
    idempotent = IdempotentRequest(conn, creator.tenant_id, "POST /v1/jobs", idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        # The replay is audited too (with no object), in the key's transaction.
        await audit_append(
            conn,
            tenant_id=creator.tenant_id,
            api_key_id=creator.api_key_id,
            actor="api_key",
            action=CREATE_JOB,
            object_id=None,
            request_id=request_id_of(request),
        )
        return JSONResponse(replay.body, status_code=replay.status_code, headers={REPLAYED_HEADER: "true"})
    job = await create_one(conn, creator, body, settings, quotas, request_id_of(request))
    await idempotent.finish(201, job)
    # Serialised here: the model was validated when built, FastAPI would validate it again.
    return Response(job.model_dump_json(), status_code=201, media_type="application/json")


async def create_one(
    conn: AsyncConnection,
    creator: KeyMatch,
    body: JobCreate,
    settings: Settings,
    quotas: Quotas,
    request_id: str | None,
) -> JobPublic:
    """The create itself, after authentication: this route's and the lean path's
    (app/api/lean_create.py)."""
    prepared = await _planned(conn, creator, body, settings, quotas)
    # The audit row is written by the same INSERT statement as the job (a data-modifying CTE):
    # still one round trip, and in autocommit the job and its audit row commit together.
    audit = _create_audit(creator, request_id)
    created = await job_create_checked(conn, creator.tenant_id, prepared, audit)
    if isinstance(created, NotCreated):
        raise not_created_problem(created)
    return job_public(created)


async def _planned(
    conn: AsyncConnection, caller: KeyMatch, body: JobCreate, settings: Settings, quotas: Quotas
) -> PreparedJob:
    """The job a create request makes, within the payload limit and the tenant's quotas, planned
    against `caller.now`."""
    payload = ensure_payload_fits(body.payload, settings)
    new = plan_create(body, caller.tenant_id, settings.default_retry_policy, caller.now)
    # Quotas: the tenant's limits and unfinished-job count are cached (app/api/quotas.py), so
    # this costs a round trip only when the cache lapses.
    await ensure_job_within_quotas(conn, quotas, caller.tenant_id, new.schedule, new.policy, caller.now)
    return PreparedJob.of(new, payload)


def _create_audit(caller: KeyMatch, request_id: str | None) -> JobAudit:
    return JobAudit(api_key_id=caller.api_key_id, request_id=request_id, action=CREATE_JOB)


async def create_for_known_key(
    conn: AsyncConnection,
    known: KeyMatch,
    key_hash: str,
    body: JobCreate,
    settings: Settings,
    quotas: Quotas,
    request_id: str | None,
) -> tuple[JobPublic, dt.datetime] | None:
    """create_one in one round trip, for a key this process has authenticated before (the
    lean path, app/api/lean_create.py): the INSERT checks the key itself, in its own snapshot,
    so a revoked key creates nothing. Returns the job and the database's now(), or None when
    nothing was written (a dead key, a refusal of any kind): create_one, after a key look-up,
    then answers as it always does.

    Only a job at a given instant (`run_at`): planning it reads the clock only to bound the
    instant ahead, and `known.now` (the database's now() as this process last saw it) is
    earlier than the database's: an instant it accepts, the true clock accepts too. A delay
    or a recurring schedule is planned from the clock itself: create_one."""
    if body.run_at is None:
        return None
    tenant_id = known.tenant_id
    try:
        prepared = await _planned(conn, known, body, settings, quotas)
    except (Problem, ScheduleError, PlanError):
        return None  # answered by create_one, after the key is checked (a revoked key is a 401)
    except Exception as exc:
        # The quotas' cache lapsed, and their read was the first statement on a pooled
        # connection that had died: create_one's key look-up retries on a fresh one.
        if not is_transient_db_error(exc):
            raise
        await fresh_connection(conn)
        return None
    try:
        row = await job_create_for_key(conn, tenant_id, key_hash, prepared, _create_audit(known, request_id))
    except Exception as exc:
        if not is_transient_db_error(exc):
            raise
        # The INSERT is the request's first statement, on a pooled connection that may have
        # died (a restarted database). In autocommit it may also have committed just before:
        # the job's id is ours, so look for it on a fresh connection.
        await fresh_connection(conn)
        found = await store.job_get(conn, tenant_id, prepared.id)
        row = None if found is None else {**found, "db_now": known.now}
    if row is None:
        quotas.jobs_created(tenant_id, -1)  # counted by ensure_job_within_quotas; create_one counts again
        return None
    return job_public(row), row["db_now"]


def not_created_problem(reason: NotCreated, field_prefix: str = "") -> Problem:
    if reason.holder is None:
        # Unknown and foreign targets look the same: a tenant learns nothing of others' ids.
        return Problem(422, "no such target", slug="validation", field=f"{field_prefix}target_id")
    return Problem(
        409,
        f"an unfinished job already has this dedup_key: {reason.holder}",
        slug="duplicate-job",
        field=f"{field_prefix}dedup_key",
        extra={"job_id": str(reason.holder)},
    )


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


@router.post("/{job_id}/cancel", operation_id="cancelJob", dependencies=[Audited])
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
