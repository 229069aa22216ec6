"""/v1/dead-letters: occurrences that exhausted their attempts; inspect, replay, delete."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from sqlalchemy.engine import RowMapping

from app.api.audit import Audited
from app.api.checks import ensure_payload_fits
from app.api.deps import Conn, LabelFilter, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.quota_checks import ensure_room_for_jobs
from app.api.schemas.dead_letters import (
    BulkReplayResult,
    DeadLetterBulkReplay,
    DeadLetterDetail,
    DeadLetterPublic,
    DeadLetterReplay,
    ReplayedJob,
)
from app.api.schemas.inputs import Timestamp
from app.api.schemas.jobs import JobPublic, RunPublic, job_public
from app.api.schemas.pages import IncludePayload, Page, page_of, rows_within_budget
from app.domain.job import JobCompletion, NewJob
from app.domain.job_plan import plan_one_off
from app.domain.payload import payload_json
from app.store import dead_letters as store
from app.store.job_rows import policy_from_row
from app.store.job_rows_new import PreparedJob
from app.store.jobs import db_now, job_create, job_create_many
from app.store.pagination import decode_time_id_cursor
from app.store.targets import target_lock_live, target_lock_live_many

router = APIRouter(prefix="/v1/dead-letters", tags=["dead-letters"], dependencies=[Audited])

NOT_FOUND = "dead letter not found"


@router.get("", operation_id="listDeadLetters")
async def list_dead_letters(
    tenant_id: TenantId,
    conn: Conn,
    job_id: uuid.UUID | None = None,
    target_id: uuid.UUID | None = None,
    since: Annotated[Timestamp | None, Query(description="created at or after (RFC 3339)")] = None,
    until: Annotated[Timestamp | None, Query(description="created before (RFC 3339)")] = None,
    status_code: Annotated[int | None, Query(ge=100, le=599, description="last HTTP status")] = None,
    labels: LabelFilter = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
    include: IncludePayload = None,
) -> Page[DeadLetterPublic]:
    """Newest first; payloads (null by default) with `include=payload`, as for jobs."""
    after = decode_time_id_cursor(cursor) if cursor else None
    where = store.DeadLetterFilter(
        job_id=job_id,
        target_id=target_id,
        since=_utc(since, "since"),
        until=_utc(until, "until"),
        last_status_code=status_code,
        labels=labels,
    )
    rows = await store.dead_letter_list(
        conn, tenant_id, limit + 1, after, where, with_payload=False, with_payload_bytes=include is not None
    )
    payloads: dict[uuid.UUID, Any] = {}
    if include is not None:
        rows, limit = rows_within_budget(rows, limit)
        payloads = await store.dead_letter_payloads(conn, tenant_id, [row["id"] for row in rows[:limit]])
    return page_of(
        rows, limit, lambda row: DeadLetterPublic.model_validate({**row, "payload": payloads.get(row["id"])})
    )


@router.get("/{dead_letter_id}", operation_id="getDeadLetter")
async def get_dead_letter(dead_letter_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> DeadLetterDetail:
    row = await store.dead_letter_get(conn, tenant_id, dead_letter_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    attempts = [RunPublic.model_validate(dict(r)) for r in await store.dead_letter_runs(conn, row["occurrence_id"])]
    return DeadLetterDetail.model_validate({**dict(row), "runs": attempts})


@router.post("/replay", operation_id="replayDeadLetters")
async def replay_dead_letters(
    body: DeadLetterBulkReplay, tenant_id: TenantId, conn: Conn, quotas: QuotasDep
) -> BulkReplayResult:
    """Replays matching dead letters as fresh jobs, oldest first, due `rate_per_s` per second."""
    where = store.DeadLetterFilter(
        job_id=body.job_id,
        target_id=body.target_id,
        since=_utc(body.since, "since"),
        until=_utc(body.until, "until"),
        last_status_code=body.status_code,
        include_replayed=body.include_replayed,
    )
    matched = await store.dead_letter_lock_for_replay(conn, tenant_id, where, body.limit)
    live = await target_lock_live_many(conn, tenant_id, {row["target_id"] for row in matched})
    rows = [row for row in matched if row["target_id"] in live]
    await ensure_room_for_jobs(conn, quotas, tenant_id, len(rows))
    now = await db_now(conn)
    # Staggered due times cap the rate across every scheduler replica, with no extra state.
    due = [now + dt.timedelta(seconds=i / body.rate_per_s) for i in range(len(rows))]
    replays = [
        _replay_job(tenant_id, row, row["payload"], row["target_id"], at) for row, at in zip(rows, due, strict=True)
    ]
    created = await job_create_many(conn, [PreparedJob.of(new, payload_json(new.payload)) for new in replays])
    await store.dead_letter_mark_replayed(
        conn, tenant_id, [(row["id"], job["id"]) for row, job in zip(rows, created, strict=True)]
    )
    replayed = [
        ReplayedJob(dead_letter_id=row["id"], job_id=job["id"], next_run_at=at)
        for row, job, at in zip(rows, created, due, strict=True)
    ]
    return BulkReplayResult(replayed=replayed, skipped_deleted_target=len(matched) - len(rows))


@router.post("/{dead_letter_id}/replay", status_code=201, operation_id="replayDeadLetter")
async def replay_dead_letter(
    dead_letter_id: uuid.UUID,
    tenant_id: TenantId,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    body: Annotated[DeadLetterReplay | None, Body()] = None,
) -> JobPublic:
    """A fresh one-off job, due now, with fresh attempts and the original job's retry policy."""
    row = await store.dead_letter_get(conn, tenant_id, dead_letter_id)
    if row is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    overrides = body.model_dump(exclude_unset=True) if body is not None else {}
    payload = overrides.get("payload", row["payload"])
    target_id = overrides.get("target_id") or row["target_id"]
    payload_text = ensure_payload_fits(payload, settings)
    await ensure_room_for_jobs(conn, quotas, tenant_id, 1)
    if not await target_lock_live(conn, tenant_id, target_id):
        detail = "no such target" if "target_id" in overrides else "the target was deleted; pass another target_id"
        raise Problem(422, detail, slug="validation", field="target_id")
    new = _replay_job(tenant_id, row, payload, target_id, await db_now(conn))
    job = await job_create(conn, PreparedJob.of(new, payload_text))
    await store.dead_letter_mark_replayed(conn, tenant_id, [(row["id"], job["id"])])
    return job_public(job)


def _replay_job(tenant_id: uuid.UUID, row: RowMapping, payload: Any, target_id: uuid.UUID, due: dt.datetime) -> NewJob:
    """A fresh one-off job with the dead letter's name, priority and retry policy."""
    return plan_one_off(
        tenant_id=tenant_id,
        target_id=target_id,
        name=row["job_name"],
        payload=payload,
        priority=row["priority"],
        policy=policy_from_row(row),
        due=due,
        completion=JobCompletion(row["completion"], row["async_timeout_s"], row["heartbeat_timeout_s"]),
    )


@router.delete("/{dead_letter_id}", status_code=204, operation_id="deleteDeadLetter")
async def delete_dead_letter(dead_letter_id: uuid.UUID, tenant_id: TenantId, conn: Conn) -> Response:
    if not await store.dead_letter_delete(conn, tenant_id, dead_letter_id):
        raise Problem(404, NOT_FOUND, slug="not-found")
    return Response(status_code=204)


def _utc(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise Problem(422, "is outside the supported range", slug="validation", field=field) from None
