"""Pause and resume: POST /v1/targets/{id}/pause and /resume (a tenant's own targets), and
POST /v1/admin/tenants/{tenant}/pause and /resume (the admin key: a whole tenant). HTTP only:
what a pause holds and a resume releases is app/store/pauses.py's.

One router: each route carries its own authentication (and audit), the targets' as every
tenant route does (`Audited`), the admin's with the admin key and an audit row of its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from fastapi import APIRouter, Request

from app.api.audit import Audited, request_id_of
from app.api.deps import Admin, CallerDep, Conn, TenantPath
from app.api.errors import Problem
from app.api.schemas.pauses import (
    PauseOptions,
    ResumeOptions,
    TargetPaused,
    TargetResumed,
    TenantPaused,
    TenantResumed,
    tenant_pause,
)
from app.api.schemas.targets import target_public
from app.api.target_upserts import NOT_FOUND
from app.domain.schedule import MAX_SCHEDULE_AHEAD
from app.store import pauses as store
from app.store.audit import audit_append
from app.store.jobs import db_now
from app.store.tenants import tenant_get_id

router = APIRouter()


def _given(body: PauseOptions | None, now: dt.datetime) -> dict[str, Any]:
    """The fields a pause sets (those sent), `until` checked against the database's clock."""
    given = (body or PauseOptions()).model_dump(exclude_unset=True)
    until = given.get("until")
    if until is not None and not now < until <= now + MAX_SCHEDULE_AHEAD:
        years = MAX_SCHEDULE_AHEAD.days // 365
        raise Problem(422, f"must be in the future, at most {years} years ahead", slug="validation", field="until")
    return given


@router.post("/v1/targets/{target_id}/pause", tags=["targets"], dependencies=[Audited], operation_id="pauseTarget")
async def pause_target(
    target_id: uuid.UUID, caller: CallerDep, conn: Conn, body: PauseOptions | None = None
) -> TargetPaused:
    """Pauses the target: none of its occurrences is delivered until it is resumed (or until
    `until`); those waiting are held, and so is each that falls due meanwhile, with no attempt
    consumed and nothing missed. A delivery already under way ends as it would have.
    `target.paused` is emitted once, when it goes from delivering to paused; pausing a paused
    target changes the `reason` and `until` sent, and emits nothing."""
    given = _given(body, caller.now)
    change = await store.target_pause(conn, caller.tenant_id, target_id, given)
    if change is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return TargetPaused(**target_public(change.row).model_dump(), held=change.count)


@router.post("/v1/targets/{target_id}/resume", tags=["targets"], dependencies=[Audited], operation_id="resumeTarget")
async def resume_target(
    target_id: uuid.UUID, caller: CallerDep, conn: Conn, body: ResumeOptions | None = None
) -> TargetResumed:
    """Resumes the target and releases its held occurrences through its own limits, as
    `on_resume` says (their count in `released`); `target.resumed` is emitted once, when it
    was paused. While its tenant is paused, they stay held until the tenant is resumed.
    Resuming a target that is not paused releases what it may still hold."""
    options = body or ResumeOptions()
    change = await store.target_resume(conn, caller.tenant_id, target_id, options.on_resume, options.drain_rate_per_s)
    if change is None:
        raise Problem(404, NOT_FOUND, slug="not-found")
    return TargetResumed(**target_public(change.row).model_dump(), released=change.count)


async def _tenant(conn: Conn, tenant: str) -> uuid.UUID:
    tenant_id = await tenant_get_id(conn, tenant)
    if tenant_id is None:
        raise Problem(404, "tenant not found", slug="not-found", field="tenant")
    return tenant_id


async def _audit(conn: Conn, request: Request, tenant_id: uuid.UUID, action: str, tenant: str) -> None:
    await audit_append(
        conn, tenant_id=tenant_id, actor="admin", action=action, object_id=tenant, request_id=request_id_of(request)
    )


@router.post("/v1/admin/tenants/{tenant}/pause", tags=["admin"], dependencies=[Admin], operation_id="adminPauseTenant")
async def pause_tenant(
    tenant: TenantPath, conn: Conn, request: Request, body: PauseOptions | None = None
) -> TenantPaused:
    """Pauses every target of the tenant (an operator's stop): as a pause of each, but their
    own pauses (and events) unchanged, so that resuming the tenant leaves paused the targets
    its users paused. Pausing it again changes the `reason` and `until` sent."""
    tenant_id = await _tenant(conn, tenant)
    given = _given(body, await db_now(conn))
    change = await store.tenant_pause(conn, tenant_id, given)
    if change is None:
        raise Problem(404, "tenant not found", slug="not-found", field="tenant")
    await _audit(conn, request, tenant_id, "adminPauseTenant", tenant)
    return TenantPaused(**tenant_pause(change.row), held=change.count)


@router.post(
    "/v1/admin/tenants/{tenant}/resume", tags=["admin"], dependencies=[Admin], operation_id="adminResumeTenant"
)
async def resume_tenant(
    tenant: TenantPath, conn: Conn, request: Request, body: ResumeOptions | None = None
) -> TenantResumed:
    """Resumes the tenant and releases the held occurrences of its targets that are not
    paused themselves, as `on_resume` says (each target's at `drain_rate_per_s`)."""
    tenant_id = await _tenant(conn, tenant)
    options = body or ResumeOptions()
    change = await store.tenant_resume(conn, tenant_id, options.on_resume, options.drain_rate_per_s)
    if change is None:
        raise Problem(404, "tenant not found", slug="not-found", field="tenant")
    await _audit(conn, request, tenant_id, "adminResumeTenant", tenant)
    return TenantResumed(**tenant_pause(change.row), released=change.count)
