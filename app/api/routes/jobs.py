"""/v1/jobs: scheduling, reading, cancelling jobs and reading their runs."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import Conn, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.schemas import JobCreate, JobPublic, Page, RunPublic, job_public, page_of
from app.domain.job import NewJob
from app.domain.occurrences import Bounds, Recurrence, first_fire_time
from app.domain.retry import RetryPolicy
from app.domain.schedule import (
    MAX_END_AT_AHEAD,
    IntervalSchedule,
    OnceSchedule,
    Schedule,
    ScheduleError,
    checked_instant,
    resolve_schedule,
)
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


@router.post("", status_code=201, operation_id="createJob", responses=REPLAYED_RESPONSE_DOC)
async def create_job(
    body: JobCreate,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    idempotent = IdempotentRequest(conn, tenant_id, "POST /v1/jobs", idempotency_key, body)
    if (replay := await idempotent.begin()) is not None:
        return JobPublic.model_validate(replay.apply(response))
    ensure_payload_fits(body.payload, settings)
    policy = retry_policy(
        body,
        RetryPolicy(
            settings.default_max_attempts,
            settings.default_backoff_base_s,
            settings.default_backoff_max_s,
            settings.default_backoff_factor,
        ),
    )
    now = await store.db_now(conn)
    schedule, first_fire_at = resolve_schedule(
        run_at=body.run_at,
        delay_s=body.delay_s,
        cron=body.cron,
        timezone=body.timezone,
        every_s=body.every_s,
        now=now,
    )
    recurrence, anchor_at, first_fire_at = plan_recurrence(body, schedule, first_fire_at, now)
    # Unknown and foreign targets look the same: a tenant learns nothing of others' ids.
    if not await target_lock_live(conn, tenant_id, body.target_id):
        raise Problem(422, "no such target", slug="validation", field="target_id")
    new = NewJob(
        tenant_id=tenant_id,
        target_id=body.target_id,
        name=body.name,
        payload=body.payload,
        priority=body.priority,
        schedule=schedule,
        first_fire_at=first_fire_at,
        policy=policy,
        dedup_key=body.dedup_key,
        recurrence=recurrence,
        anchor_at=anchor_at,
    )
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
    await idempotent.finish(201, job)
    return job


def retry_policy(body: JobCreate, base: RetryPolicy) -> RetryPolicy:
    """The request's retry fields over `base` (the defaults, or the job's current policy)."""
    policy = RetryPolicy(
        max_attempts=body.max_attempts or base.max_attempts,
        backoff_base_s=body.backoff_base_s or base.backoff_base_s,
        backoff_max_s=body.backoff_max_s or base.backoff_max_s,
        backoff_factor=body.backoff_factor or base.backoff_factor,
    )
    if policy.backoff_max_s < policy.backoff_base_s:
        # Name the field the client sent: a base above the (default or current) cap, or a cap below the base.
        if "backoff_max_s" in body.model_fields_set:
            raise Problem(422, "must be at least backoff_base_s", slug="validation", field="backoff_max_s")
        detail = f"must be at most backoff_max_s ({policy.backoff_max_s:g} s)"
        raise Problem(422, detail, slug="validation", field="backoff_base_s")
    return policy


RECURRENCE_FIELDS = (
    "interval_mode",
    "misfire_policy",
    "misfire_grace_s",
    "catch_up_limit",
    "overlap_policy",
    "start_at",
    "end_at",
    "max_runs",
)


def plan_recurrence(
    body: JobCreate,
    schedule: Schedule,
    first_fire_at: dt.datetime,
    now: dt.datetime,
    current: Recurrence | None = None,
) -> tuple[Recurrence | None, dt.datetime, dt.datetime]:
    """A recurring job's policies and bounds (the request's, over `current`'s), with its
    anchor and first fire time; one-off jobs get None and keep their fire time."""
    given = [f for f in RECURRENCE_FIELDS if f in body.model_fields_set and getattr(body, f) is not None]
    if isinstance(schedule, OnceSchedule):
        if given:
            raise ScheduleError(given[0], "applies only to a recurring job (cron or every_s)")
        return None, first_fire_at, first_fire_at
    if body.interval_mode is not None and not isinstance(schedule, IntervalSchedule):
        raise ScheduleError("interval_mode", "applies only to an every_s schedule")
    base = current or Recurrence(schedule, first_fire_at)
    sent = body.model_fields_set
    # A bound sent as null is removed (PATCH); one not sent stays as it was.
    start_at = body.start_at if "start_at" in sent else base.bounds.start_at
    end_at = body.end_at if "end_at" in sent else base.bounds.end_at
    bounds = Bounds(
        None if start_at is None else checked_instant("start_at", start_at, now),
        None if end_at is None else checked_instant("end_at", end_at, now, MAX_END_AT_AHEAD),
        body.max_runs if "max_runs" in sent else base.bounds.max_runs,
    )
    first = first_fire_time(schedule, bounds, now)
    if first is None:
        raise ScheduleError("end_at", "the schedule never fires before end_at")
    anchor, first_at = first
    recurrence = Recurrence(
        schedule=schedule,
        anchor=anchor,
        interval_mode=body.interval_mode or base.interval_mode,
        misfire_policy=body.misfire_policy or base.misfire_policy,
        misfire_grace_s=body.misfire_grace_s if body.misfire_grace_s is not None else base.misfire_grace_s,
        catch_up_limit=body.catch_up_limit or base.catch_up_limit,
        overlap_policy=body.overlap_policy or base.overlap_policy,
        bounds=bounds,
    )
    return recurrence, anchor, first_at


@router.get("", operation_id="listJobs")
async def list_jobs(
    tenant_id: TenantId,
    conn: Conn,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
    parent_job_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Page[JobPublic]:
    after = decode_time_id_cursor(cursor) if cursor else None
    rows = await store.job_list(
        conn, tenant_id, limit + 1, after, state=state, target_id=target_id, parent_job_id=parent_job_id
    )
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
