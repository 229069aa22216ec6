"""/v1/schedules/{key}: named schedules, put (created or replaced, idempotently), read and
deleted by their key. HTTP only: the upsert is app/api/schedule_upserts.py."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.engine import RowMapping

from app.api.audit import Audited, request_id_of
from app.api.chains import cancel_chain_below
from app.api.deps import CallerDep, Conn, LabelFilter, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.schedule_upserts import check_key, etag, put_schedule, schedule_definition
from app.api.schemas.inputs import PlainText
from app.api.schemas.jobs import JobCreate, JobPublic, NamedSchedule, job_public
from app.api.schemas.pages import Page, page_of
from app.store import jobs as store
from app.store.pagination import decode_text_cursor, encode_cursor
from app.store.schedule_keys import job_by_key, job_lock_by_key, schedule_list

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], dependencies=[Audited])

KeyPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        description="The schedule's key: [a-z0-9][a-z0-9._-]{0,199}, unique among the tenant's unfinished jobs",
    ),
]
_ETAG_HEADER = {
    "ETag": {"description": "The schedule's definition: send it back in If-Match", "schema": {"type": "string"}}
}


async def _answered(conn: Conn, tenant_id: uuid.UUID, row: RowMapping) -> RowMapping:
    """The schedule's job as the API answers it, with the health it shows: read again when
    the statement that found it (by key) did not say."""
    if "health" in row:
        return row
    found = await store.job_get(conn, tenant_id, row["id"])
    assert found is not None, "the job was just read in this transaction"
    return found


@router.get("", operation_id="listSchedules", response_model=Page[dict[str, Any]])
async def list_named_schedules(
    tenant_id: TenantId,
    conn: Conn,
    set_name: Annotated[PlainText | None, Query(alias="set", description="Only the schedules of this set")] = None,
    labels: LabelFilter = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 200,
    cursor: str | None = None,
) -> Page[dict[str, Any]]:
    """The tenant's named schedules by key, each as its definition: a body PUT /v1/schedules/
    {key} (or an item of a set's PUT) would take, with its `key` and `set`. Putting them back
    changes nothing (`cronhook export`)."""
    after = decode_text_cursor(cursor) if cursor else None
    rows = await schedule_list(conn, tenant_id, set_name, limit + 1, after, labels)
    return page_of(rows, limit, schedule_definition, lambda row: encode_cursor(row["schedule_key"]))


@router.put(
    "/{key}",
    operation_id="putSchedule",
    response_model=NamedSchedule,
    responses={200: {"headers": _ETAG_HEADER}, 201: {"model": NamedSchedule, "headers": _ETAG_HEADER}},
)
async def put_named_schedule(
    key: KeyPath,
    body: JobCreate,
    request: Request,
    caller: CallerDep,
    conn: Conn,
    settings: SettingsDep,
    quotas: QuotasDep,
    if_match: Annotated[str | None, Header(description="Change only if the schedule has this ETag")] = None,
    if_none_match: Annotated[str | None, Header(description="`*`: create only, if no schedule has the key")] = None,
) -> Any:
    """Creates the schedule named `key` (201) or makes it match this body (200): a body that
    changes nothing writes nothing (the job keeps its next_run_at and runs); a new schedule
    recomputes the next fire time, a new payload or policy keeps it. The body is a job's, as
    for POST /v1/jobs, with run_at rather than delay_s."""
    done = await put_schedule(
        conn, caller, key, body, settings, quotas, (if_match, if_none_match), request_id_of(request)
    )
    # A new schedule's audit row went in with its job (the create statement's own).
    request.state.audited = done.created
    shown = NamedSchedule(
        **job_public(await _answered(conn, caller.tenant_id, done.row)).model_dump(), changed=done.changed
    )
    return JSONResponse(
        shown.model_dump(mode="json"), status_code=201 if done.created else 200, headers={"ETag": etag(done.row)}
    )


@router.get("/{key}", operation_id="getSchedule", response_model=JobPublic, responses={200: {"headers": _ETAG_HEADER}})
async def get_named_schedule(key: KeyPath, tenant_id: TenantId, conn: Conn) -> Any:
    check_key(key)
    row = await job_by_key(conn, tenant_id, key)
    if row is None:
        raise Problem(404, f"no schedule is named {key!r}", slug="not-found")
    answered = job_public(await _answered(conn, tenant_id, row))
    return JSONResponse(answered.model_dump(mode="json"), headers={"ETag": etag(row)})


@router.delete("/{key}", operation_id="deleteSchedule", response_model=JobPublic)
async def delete_named_schedule(
    key: KeyPath,
    tenant_id: TenantId,
    conn: Conn,
    cascade: Annotated[bool, Query(description="Also cancel the unfinished jobs chained after it")] = False,
) -> JobPublic:
    """Cancels the schedule's job and frees its key at once (a PUT may name a new one)."""
    check_key(key)
    row = await job_lock_by_key(conn, tenant_id, key)
    if row is None:
        raise Problem(404, f"no schedule is named {key!r}", slug="not-found")
    cancelled = await store.job_cancel(conn, tenant_id, row["id"])
    assert cancelled is not None, "the row is locked and unfinished"
    await cancel_chain_below(conn, tenant_id, row["id"], cascade)
    return job_public(cancelled)
