"""/v1/jobs: scheduling, reading, cancelling jobs and reading their runs (HTTP only: the create
itself is app/api/job_creates.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from app.api.audit import Audited, request_id_of
from app.api.chains import cancel_chain_below
from app.api.checks import JOB_NOT_FOUND, existing_job
from app.api.deps import Conn, CreateConn, CreatorDep, LabelFilter, QuotasDep, SettingsDep, TenantId
from app.api.errors import Problem
from app.api.idempotency import REPLAYED_HEADER, REPLAYED_RESPONSE_DOC, IdempotencyKey, IdempotentRequest
from app.api.job_creates import CREATE_JOB, QuickCreate, create_one
from app.api.schemas.inputs import PlainText
from app.api.schemas.jobs import JobCreate, JobPublic, RunPublic, job_public, open_run
from app.api.schemas.pages import IncludePayload, Page, page_of, rows_within_budget
from app.domain.health import Health
from app.domain.states import JobState
from app.store import jobs as store
from app.store.audit import audit_append
from app.store.pagination import decode_int_cursor, decode_time_id_cursor, encode_cursor
from app.store.runs import job_open_attempts, run_list_for_job


class JobCreateRoute(APIRoute):
    """The create's route: FastAPI's handler, with the usual request answered first by the
    create use case's quick branch (app/api/job_creates.py, QuickCreate) when the app has one
    (`app.state.quick_create`). A custom route class is FastAPI's public hook for this; the
    route, its dependencies and its schema stay the reference and the published contract."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        full = super().get_route_handler()

        async def handler(request: Request) -> Response:
            quick: QuickCreate | None = request.app.state.quick_create
            if quick is not None and (answered := await quick.answer(request)) is not None:
                return answered
            return await full(request)

        return handler


router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def add_create_route(app_router: APIRouter) -> None:
    """POST /v1/jobs, with its route class, on the app's own router: the API's hottest request
    is then matched first, without passing through an included router's candidates (half of
    the framework's cost of a create before this)."""
    app_router.add_api_route(
        "/v1/jobs",
        create_job,
        methods=["POST"],
        status_code=201,
        operation_id=CREATE_JOB,
        response_model=JobPublic,
        responses=REPLAYED_RESPONSE_DOC,
        tags=["jobs"],
        route_class_override=JobCreateRoute,
    )


# The create writes its own audit row (with the job, see app/api/job_creates.py); the other
# mutations carry the `Audited` dependency, which would take a second connection here.
async def create_job(
    body: JobCreate,
    creator: CreatorDep,
    conn: CreateConn,
    settings: SettingsDep,
    quotas: QuotasDep,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    # The reference path (most creates are answered by JobCreateRoute's quick branch). Round
    # trips without a key: the key look-up (with the clock), then one INSERT that share-locks
    # the target and honours dedup_key, both in autocommit.
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


@router.get("", operation_id="listJobs")
async def list_jobs(
    tenant_id: TenantId,
    conn: Conn,
    state: JobState | None = None,
    target_id: uuid.UUID | None = None,
    parent_job_id: uuid.UUID | None = None,
    after_job_id: Annotated[
        uuid.UUID | None, Query(description="The jobs chained after this one (its children in a chain)")
    ] = None,
    labels: LabelFilter = None,
    health: Annotated[
        Health | None, Query(description="Only the jobs showing this health (e.g. `failing`: README, Schedule health)")
    ] = None,
    q: Annotated[
        PlainText | None,
        Query(min_length=1, max_length=200, description="A job id, or part of a job's name or schedule key (any case)"),
    ] = None,
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
        after_job_id=after_job_id,
        labels=labels,
        with_payload=False,
        with_payload_bytes=include is not None,
        health=health,
        search=q,
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
async def cancel_job(
    job_id: uuid.UUID,
    tenant_id: TenantId,
    conn: Conn,
    cascade: Annotated[
        bool,
        Query(description="Also cancel the unfinished jobs chained after this one (without it, they make a 409)"),
    ] = False,
) -> JobPublic:
    row = await store.job_cancel(conn, tenant_id, job_id)
    if row is not None:
        await cancel_chain_below(conn, tenant_id, job_id, cascade)
        return job_public(row)
    existing = await existing_job(conn, tenant_id, job_id)
    raise Problem(
        409,
        f"job is already {existing['state'].value}",
        slug="job-finished",
        extra={"state": existing["state"].value},
    )


RunOrder = Annotated[
    Literal["desc", "asc"],
    Query(
        description="`desc` (default): newest first, open async attempts (`awaiting_completion`) at the start of "
        "the first page; `asc`: oldest first, open attempts at the end of the last page. `next_cursor` pages on "
        "in the same order"
    ),
]


@router.get("/{job_id}/runs", operation_id="listJobRuns")
async def list_runs(
    job_id: uuid.UUID,
    tenant_id: TenantId,
    conn: Conn,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: str | None = None,
    order: RunOrder = "desc",
) -> Page[RunPublic]:
    """A job's attempts, its children's included (occurrences handed off or triggered)."""
    newest_first = order == "desc"
    cursor_id = decode_int_cursor(cursor) if cursor else None
    rows = await run_list_for_job(conn, tenant_id, job_id, limit + 1, cursor_id, newest_first=newest_first)
    if rows is None:
        raise Problem(404, JOB_NOT_FOUND, slug="not-found")
    page = page_of(rows, limit, lambda row: RunPublic.model_validate(dict(row)), lambda row: encode_cursor(row["id"]))
    # Open async attempts have no run row yet (id 0), and are the newest attempts: the start of
    # the first page newest first, the end of the last page oldest first.
    if newest_first and cursor is None:
        page.items[:0] = [open_run(row) for row in reversed(await job_open_attempts(conn, tenant_id, job_id))]
    elif not newest_first and page.next_cursor is None:
        page.items.extend(open_run(row) for row in await job_open_attempts(conn, tenant_id, job_id))
    return page
